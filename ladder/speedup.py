"""Speed-ups with their spread: each arm's TPOT against a named spec-off run's at every c, from --repeats.

A ratio of two arms means something only if both saw the same machine. Each arm is repeated (--repeats), so
each carries its own spread; the speed-up's interval is the widest its repeats allow,
[min(base) / max(arm), max(base) / min(arm)], and its point is mean(base) / mean(arm). A rung of one run has
no interval and says so. The arms' load averages (their manifests' start and end) are compared too: when they
differ by more than LOAD_MOVED, the table says the load moved between arms, else that it held, naming the figures.

    python -m ladder.speedup BASELINE_DIR ARM_DIR... [--metric tpot_ms.p50]   (a markdown table on stdout)
"""

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ladder.runs import Run, RungRow, load_runs

LOAD_MOVED = 0.5  # 1-minute load average: a difference past this between arms is reported


@dataclass(frozen=True)
class Speedup:
    ratio: float  # mean(base) / mean(arm): above 1, the arm is faster
    low: float | None  # None: one run each side, no spread
    high: float | None
    runs: int  # the fewer repeats of the two sides


def values(row: RungRow | None, metric: str) -> list[float]:
    """The metric over the rung's repeats (one value without --repeats); empty for a rung without numbers or
    with part of them (PARTIAL: an interrupt cut it short, so its requests are not the baseline's)."""
    if row is None or row.status != "OK" or "PARTIAL" in row.flags:
        return []
    if row.repeats and metric in row.repeats.get("metrics", {}):
        return list(row.repeats["metrics"][metric]["values"])
    node: object = row.stats
    for part in metric.split("."):  # a Summary keeps its percentiles one level down: tpot_ms.percentiles.p50
        node = (node.get(part, (node.get("percentiles") or {}).get(part)) if isinstance(node, dict) else None)
    return [node] if isinstance(node, int | float) else []


def speedup(base: Sequence[float], arm: Sequence[float]) -> Speedup | None:
    if not base or not arm or min(arm) <= 0:
        return None
    ratio = statistics.fmean(base) / statistics.fmean(arm)
    if len(base) < 2 or len(arm) < 2:
        return Speedup(ratio, None, None, min(len(base), len(arm)))
    return Speedup(ratio, min(base) / max(arm), max(base) / min(arm), min(len(base), len(arm)))


def cell(s: Speedup | None) -> str:
    if s is None:
        return "n/a"
    if s.low is None:
        return f"{s.ratio:.2f}x (1 run: no spread)"
    return f"{s.ratio:.2f}x ({s.low:.2f}-{s.high:.2f}, {s.runs} runs)"


def load_moved(runs: Sequence[Run]) -> str | None:
    """The load averages the arms saw, and whether they moved between the arms by more than LOAD_MOVED (so a
    reader knows it was checked); None when fewer than two arms recorded them."""
    seen = {}
    for run in runs:
        avg = (run.host or {}).get("load_average") or {}
        ones = [v["1m"] for v in (avg.get("start"), avg.get("end")) if v]
        if ones:
            seen[run.label] = ones
    if len(seen) < 2:
        return None
    flat = [v for ones in seen.values() for v in ones]
    figures = ", ".join(f"{label} {' -> '.join(f'{v:.1f}' for v in ones)}" for label, ones in seen.items())
    if max(flat) - min(flat) <= LOAD_MOVED:
        return (f"The load held between arms (1-minute load average at each arm's start and end, all within "
                f"{LOAD_MOVED:g}: {figures}).")
    return (f"The load moved between arms (1-minute load average at each arm's start and end: {figures}): "
            "compare the ratios with their spread, not their points.")


def table(base: Run, arms: Sequence[Run], metric: str = "tpot_ms.p50") -> str:
    """Markdown: one row per arm, one column per c, each cell base / arm with its interval."""
    loads = list(base.rungs)
    lines = [f"Speed-up in {metric} against {base.label} (its {metric} over the arm's; interval: the extremes "
             f"of the repeats, min(base)/max(arm) to max(base)/min(arm)):", "",
             "| arm | " + " | ".join(f"c={c:g}" for c in loads) + " |", "|---" * (len(loads) + 1) + "|"]
    for arm in arms:
        cells = [cell(speedup(values(base.rungs.get(c), metric), values(arm.rungs.get(c), metric))) for c in loads]
        lines.append(f"| {arm.label} | " + " | ".join(cells) + " |")
    moved = load_moved([base, *arms])
    return "\n".join(lines + ([""] + [moved] if moved else []) + by_content(base, arms))


def content_values(row: RungRow | None, kind: str) -> list[float]:
    """One content type's mean TPOT in each repeat (ladder.repeats keeps them); the pooled mean of a rung run
    once; empty for a rung without numbers."""
    if not values(row, "tpot_ms.p50"):  # VOID, NOT_RUN, PARTIAL or missing: no number, as for the whole rung
        return []
    kept = ((row.repeats or {}).get("by_content") or {}).get(kind)
    if kept:
        return list(kept["tpot_ms.mean"]["values"])
    mean = (((row.by_content or {}).get(kind) or {}).get("tpot_ms") or {}).get("mean")
    return [] if mean is None else [mean]


def by_content(base: Run, arms: Sequence[Run]) -> list[str]:
    """--dataset mix: each arm's mean TPOT and acceptance per content type at each c, and its speed-up over the
    baseline's for the same type with the interval of the repeats."""
    kinds = list(dict.fromkeys(k for run in (base, *arms) for row in run.rungs.values() for k in row.by_content or {}))
    if not kinds:
        return []
    lines = ["", f"Per content type (mean TPOT in ms over the requests, acceptance length, speed-up over "
             f"{base.label}'s TPOT for the same type with the interval of the repeats' per-type means):", "",
             "| arm | c | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 2) + "|"]
    for arm in (base, *arms):
        for c, row in arm.rungs.items():
            cells = []
            for kind in kinds:
                stats = (row.by_content or {}).get(kind) if values(row, "tpot_ms.p50") else None
                tpot = ((stats or {}).get("tpot_ms") or {}).get("mean")
                if tpot is None:
                    cells.append("n/a")
                    continue
                spec = stats.get("spec")
                accept = f", accept {spec['weighted_acceptance_length']:.2f}" if spec else ""
                ratio = (f", {cell(speedup(content_values(base.rungs.get(c), kind), content_values(row, kind)))}"
                         if arm is not base else "")
                cells.append(f"{tpot:.1f} ms{accept}{ratio}")
            lines.append(f"| {arm.label} | {c:g} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ladder.speedup", description=__doc__.splitlines()[0])
    parser.add_argument("baseline")
    parser.add_argument("arms", nargs="+")
    parser.add_argument("--metric", default="tpot_ms.p50")
    args = parser.parse_args(argv)
    base, *arms = load_runs([Path(p) for p in (args.baseline, *args.arms)])
    print(table(base, arms, args.metric))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
