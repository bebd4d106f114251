"""The comparison's plots (matplotlib, Agg, PNG): one line per run, a rung without numbers as a gap.

- throughput.png: output tok/s against c
- latency.png: TPOT and TTFT (the report's percentile) against c
- interactivity.png: per-user tok/s (median of 1/TPOT) on x, output tok/s on y, one point per rung
- server_metrics.png: running and waiting requests and KV usage over time from each run's metrics.jsonl,
  one line per run, rungs shaded by their load (only when some run has a series)

A VOID or NOT_RUN rung breaks its line and is marked with an X near the foot of the axes, one height per
run so that runs VOID at the same rung do not overprint; the interactivity plot, which has no place for a
rung without numbers, names them in a box instead.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ladder import rfc_json
from ladder.compare import SERVER_SERIES, series_label
from ladder.runs import Run, concurrencies
from ladder.table import OUTPUT_TPUT, PER_USER, TPOT, TTFT, Metric, rung_name, value

MARKERS = ("o", "s", "^", "D", "v", "P", "*")
DPI = 120
VOID_FOOT, VOID_STEP = 0.03, 0.07  # axes fractions: the first run's X, and the rise per further run


@dataclass(frozen=True)
class Plot:
    caption: str
    path: Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a build machine
    import matplotlib.pyplot as plt

    return plt


def _series(run: Run, cs: Sequence[int], metric: Metric, pct: str) -> list[float]:
    return [math.nan if (v := value(run, c, metric, pct)) is None else v for c in cs]


def _missing(run: Run, cs: Sequence[int]) -> list[tuple[int, str]]:
    return [(c, run.rungs[c].status) for c in cs if c in run.rungs and run.rungs[c].status != "OK"]


def _open_loop(runs: Sequence[Run]) -> bool:
    return any(row.request_rate is not None for run in runs for row in run.rungs.values())


def _against_c(ax, runs: Sequence[Run], metric: Metric, pct: str, ylabel: str) -> None:
    # NOTE: a log axis has no place for rate inf ("all at once"); the tables still show that rung.
    cs = [c for c in concurrencies(runs) if math.isfinite(c)]
    for i, run in enumerate(runs):
        line, = ax.plot(cs, _series(run, cs, metric, pct), marker=MARKERS[i % len(MARKERS)], label=run.label)
        height = VOID_FOOT + VOID_STEP * i
        for c, status in _missing(run, cs):
            # near the foot of the axes, in the run's colour: the rung ran but has no number
            ax.plot([c], [height], transform=ax.get_xaxis_transform(), marker="X", markersize=11,
                    color=line.get_color(), linestyle="none")
            ax.annotate(status, (c, height), xycoords=ax.get_xaxis_transform(), xytext=(6, 4),
                        textcoords="offset points", fontsize=7, color=line.get_color())
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs, [f"{c:g}" for c in cs])
    ax.minorticks_off()
    ax.set_xlabel("request rate (req/s, open loop)" if _open_loop(runs) else "concurrency c (requests in flight)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)


def _void_legend(ax, runs: Sequence[Run]) -> None:
    if any(_missing(r, concurrencies(runs)) for r in runs):
        ax.plot([], [], marker="X", color="grey", linestyle="none", label="VOID / NOT_RUN: no numbers")
    ax.legend(fontsize=8)


def _finish(plt, fig, title: str, caption: str, path: Path) -> None:
    fig.suptitle(title)
    fig.text(0.5, 0.01, f"Workload: {caption}", ha="center", va="bottom", fontsize=8, wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def throughput_plot(runs: Sequence[Run], pct: str, caption: str, path: Path) -> Plot:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _against_c(ax, runs, OUTPUT_TPUT, pct, "output throughput (tok/s)")
    _void_legend(ax, runs)
    _finish(plt, fig, "Output throughput against concurrency", caption, path)
    return Plot("output tok/s against c", path)


def latency_plot(runs: Sequence[Run], pct: str, caption: str, path: Path) -> Plot:
    plt = _pyplot()
    fig, (tpot, ttft) = plt.subplots(1, 2, figsize=(11, 4.5))
    _against_c(tpot, runs, TPOT, pct, f"TPOT {pct} (ms per output token)")
    _against_c(ttft, runs, TTFT, pct, f"TTFT {pct} (ms)")
    tpot.set_title("time per output token")
    ttft.set_title("time to first token")
    _void_legend(tpot, runs)
    _finish(plt, fig, f"Latency ({pct} over requests) against concurrency", caption, path)
    return Plot(f"TPOT and TTFT ({pct}) against c", path)


def interactivity_plot(runs: Sequence[Run], pct: str, caption: str, path: Path) -> Plot:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    cs = concurrencies(runs)
    voids: list[str] = []
    for i, run in enumerate(runs):
        xs, ys = _series(run, cs, PER_USER, pct), _series(run, cs, OUTPUT_TPUT, pct)
        line, = ax.plot(xs, ys, marker=MARKERS[i % len(MARKERS)], label=run.label)
        for c, x, y in zip(cs, xs, ys):
            if not (math.isnan(x) or math.isnan(y)):
                ax.annotate(f"rate={c:g}" if run.rungs[c].request_rate is not None else f"c={c}", (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7,
                            color=line.get_color())
        voids += [f"{run.label} {rung_name(run.rungs[c])}: {status}" for c, status in _missing(run, cs)]
    if voids:
        ax.text(0.98, 0.02, "no numbers (gaps):\n" + "\n".join(voids), transform=ax.transAxes, ha="right",
                va="bottom", fontsize=7, bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8})
    ax.set_xlabel("per-user rate (tok/s, median over requests of 1/TPOT)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.margins(x=0.1)  # room for the c= labels at the right edge
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")  # the corners hold the fastest and the busiest rungs
    _finish(plt, fig, "Interactivity: throughput against per-user rate", caption, path)
    return Plot("interactivity: output tok/s against per-user tok/s", path)


def _samples(run: Run) -> list[dict]:
    path = run.path / "metrics.jsonl"
    return [rfc_json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


TIME_SERIES = ("running", "waiting", "kv_usage")


def time_series(rows: list[dict]) -> tuple[list[float], list[tuple[str, str, list[float]]]]:
    """x (seconds since the run started) and each (series, axis label, y) of the measured phases, in the
    unit and scale of compare's table (SERVER_SERIES: KV usage in %, as vLLM's gauge is a fraction); a NaN
    between rungs (and repeats) breaks the line rather than draw it across the pause between them."""
    xs: list[float] = []
    ys: dict[str, list[float]] = {name: [] for name in TIME_SERIES}
    prev = None
    for s in rows:
        if s.get("phase", "measured") != "measured":
            continue
        key = (s.get("concurrency"), s.get("request_rate"), s.get("repeat"))
        if prev is not None and key != prev:
            xs.append(math.nan)
            for v in ys.values():
                v.append(math.nan)
        prev = key
        xs.append(s["t"])
        for name, v in ys.items():
            v.append(SERVER_SERIES[name][3] * s["values"].get(name, math.nan))
    return xs, [(name, series_label(name), ys[name]) for name in TIME_SERIES]


def server_metrics_plot(runs: Sequence[Run], caption: str, path: Path) -> Plot | None:
    """The scraped series against time since each run's start; None when no run has any."""
    samples = {run.label: _samples(run) for run in runs}
    if not any(samples.values()):
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(TIME_SERIES), 1, figsize=(9, 7), sharex=True)
    for i, run in enumerate(runs):
        xs, series = time_series(samples[run.label])
        for ax, (_, label, ys) in zip(axes, series):
            ax.plot(xs, ys, marker=MARKERS[i % len(MARKERS)], markersize=3, label=run.label)
            ax.set_ylabel(label)
            ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("seconds since the run started (samples of the measured phases only)")
    axes[0].legend(fontsize=8)
    _finish(plt, fig, "Server metrics over time (/metrics)", caption, path)
    return Plot("server metrics over time", path)


def write_plots(runs: Sequence[Run], pct: str, caption: str, out_dir: Path) -> list[Plot]:
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = [throughput_plot(runs, pct, caption, out_dir / "throughput.png"),
             latency_plot(runs, pct, caption, out_dir / "latency.png"),
             interactivity_plot(runs, pct, caption, out_dir / "interactivity.png"),
             server_metrics_plot(runs, caption, out_dir / "server_metrics.png")]
    return [p for p in plots if p is not None]
