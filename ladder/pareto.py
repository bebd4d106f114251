"""`ladder sweep --pareto ISL:OSL,...`: a ladder per input/output length pair over c = 1, 2, 4 .. --max-c (each
rung with its --repeats), then the Pareto front of output tok/s per user against output tok/s in total (per GPU
where the manifest saw GPUs), as `vllm bench sweep` plots it and AIPerf's pareto-sweep recipe runs it.

Per user is the rung's median of 1 / TPOT; a point is on the front when no other point is at least as good on
both axes and better on one. OUT/ISLxOSL/ holds each pair's run; OUT/pareto.csv every point with its
`on_front` mark, OUT/pareto.md the same as a table, OUT/pareto.png the plot.
"""

import csv
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ladder.config import RunConfig, SetupError
from ladder.display import Display
from ladder.plots import DPI, MARKERS, _pyplot
from ladder.runner import default_out_dir, run_ladder
from ladder.runs import load_run


@dataclass(frozen=True)
class Point:
    pair: str  # "ISLxOSL"
    concurrency: int
    per_user_tok_s: float
    output_tok_s: float  # per GPU when num_gpus, else the total
    num_gpus: int  # 0: none seen, so the y axis is the total


def parse_pairs(text: str) -> tuple[tuple[int, int], ...]:
    """'128:32,512:64' -> ((128, 32), (512, 64)); a one-line SetupError otherwise."""
    pairs = []
    for item in text.split(","):
        isl, sep, osl = item.strip().partition(":")
        if not sep or not isl.isdigit() or not osl.isdigit() or int(isl) < 1 or int(osl) < 2:
            raise SetupError(f"--pareto {text!r}: expected ISL:OSL pairs such as 128:32,512:64 (OSL at least 2)")
        pairs.append((int(isl), int(osl)))
    return tuple(dict.fromkeys(pairs))


def doubling(max_c: int) -> tuple[int, ...]:
    out, c = [], 1
    while c < max_c:
        out.append(c)
        c *= 2
    return (*out, max_c)


def points(run_dir: Path, pair: str) -> list[Point]:
    run = load_run(run_dir)
    gpus = len((run.host or {}).get("gpus") or ())
    out = []
    for row in run.rungs.values():
        stats = row.stats or {}
        if row.status == "OK" and stats.get("per_user_tok_s"):
            total = stats["output_throughput"]
            out.append(Point(pair, row.concurrency, stats["per_user_tok_s"], total / gpus if gpus else total, gpus))
    return out


def front(pts: Sequence[Point]) -> set[Point]:
    """The points no other point dominates (at least as high on both axes, higher on one)."""
    def dominated(p: Point) -> bool:
        return any(q.per_user_tok_s >= p.per_user_tok_s and q.output_tok_s >= p.output_tok_s
                   and (q.per_user_tok_s, q.output_tok_s) != (p.per_user_tok_s, p.output_tok_s) for q in pts)
    return {p for p in pts if not dominated(p)}


def write(out: Path, pts: Sequence[Point]) -> set[Point]:
    on = front(pts)
    y = "output tok/s per GPU" if pts and all(p.num_gpus for p in pts) else "output tok/s (total: no GPU seen)"
    with open(out / "pareto.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["pair", "concurrency", "per_user_tok_s", "output_tok_s", "num_gpus", "on_front"])
        for p in pts:
            w.writerow([p.pair, p.concurrency, f"{p.per_user_tok_s:.3f}", f"{p.output_tok_s:.3f}", p.num_gpus,
                        p in on])
    rows = [f"| {p.pair} | {p.concurrency} | {p.per_user_tok_s:.1f} | {p.output_tok_s:.1f} | "
            f"{'yes' if p in on else ''} |" for p in pts]
    (out / "pareto.md").write_text("\n".join([
        f"# Pareto sweep: per-user tok/s (median of 1 / TPOT) against {y}", "",
        f"| ISLxOSL | c | tok/s per user | {y} | on the front |", "|---|---|---|---|---|", *rows, ""]))
    _plot(out / "pareto.png", pts, on, y)
    return on


def _plot(path: Path, pts: Sequence[Point], on: set[Point], y: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for i, pair in enumerate(dict.fromkeys(p.pair for p in pts)):
        mine = [p for p in pts if p.pair == pair]
        ax.plot([p.per_user_tok_s for p in mine], [p.output_tok_s for p in mine], marker=MARKERS[i % len(MARKERS)],
                linestyle=":", label=f"ISLxOSL {pair}")
        for p in mine:
            ax.annotate(f"c={p.concurrency}", (p.per_user_tok_s, p.output_tok_s), fontsize=7)
    best = sorted(on, key=lambda p: p.per_user_tok_s)
    ax.plot([p.per_user_tok_s for p in best], [p.output_tok_s for p in best], color="black", linewidth=1.5,
            marker="o", markersize=11, markerfacecolor="none", label="Pareto front")
    ax.set_xlabel("output tok/s per user (median of 1 / TPOT)")
    ax.set_ylabel(y)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle("Pareto sweep: interactivity against throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def run_pareto(config: RunConfig, pairs: Sequence[tuple[int, int]], display: Display) -> int:
    """One ladder per pair into OUT/ISLxOSL/, then the front; the worst exit code of the ladders."""
    out = config.out_dir or default_out_dir(config.label)
    out.mkdir(parents=True, exist_ok=config.overwrite)
    status, pts = 0, []
    for isl, osl in pairs:
        pair = f"{isl}x{osl}"
        cfg = replace(config, input_len=isl, output_len=osl, out_dir=out / pair, label=f"{config.label}-{pair}")
        status = max(status, run_ladder(cfg, display))
        if (out / pair / "rungs.json").exists():
            pts += points(out / pair, pair)
    if not pts:
        display.note("pareto: no OK rung with a per-user rate: nothing to plot")
        return status or 1
    on = write(out, pts)
    display.note(f"pareto: {len(pts)} points, {len(on)} on the front; wrote {out / 'pareto.png'}, "
                 f"{out / 'pareto.csv'} and {out / 'pareto.md'}")
    return status
