"""acceptance.png: each rung's acceptance length over its requests (spec_metrics.SpecDistribution's
histogram), one panel per run, one outline per rung, with the step-weighted mean marked. Only runs whose
server reported drafts per request have one; None when none did."""

from collections.abc import Sequence
from pathlib import Path

from ladder.plots import MARKERS, Plot, _finish, _pyplot
from ladder.runs import Run
from ladder.table import rung_name


def acceptance_plot(runs: Sequence[Run], caption: str, path: Path) -> Plot | None:
    shown = [run for run in runs if any(row.spec_requests for row in run.rungs.values())]
    if not shown:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 2.8 * len(shown) + 1), squeeze=False)
    for ax, run in zip(axes[:, 0], shown):
        for i, row in enumerate(run.rungs.values()):
            dist = row.spec_requests
            if not dist:
                continue
            hist = dist["histogram"]
            label = f"{rung_name(row)}: p50 {dist['p50']:.2f}, weighted {dist['weighted_acceptance_length']:.2f}"
            line = ax.stairs(hist["counts"], hist["edges"], label=label, linewidth=1.5)
            ax.axvline(dist["weighted_acceptance_length"], color=line.get_edgecolor(), linestyle=":",
                       marker=MARKERS[i % len(MARKERS)])
        ax.set_title(run.label, fontsize=9)
        ax.set_ylabel("requests")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("acceptance length per request (tokens per verify step); dotted: step-weighted mean")
    _finish(plt, fig, "Acceptance length over requests, per rung", caption, path)
    return Plot("acceptance length over requests", path)
