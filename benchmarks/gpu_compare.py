"""reports/gpu-compare.md: two runs of benchmarks/gpu_bench.py (a base commit and the head, one after the other
on the same card, as `make gpu-compare` runs them) side by side: every TPOT row both runs have, its median
over the run's repeats, the ratio head / base, and a mark where the head is more than TOLERANCE slower.
A benchmark report, not a test: it flags, it never fails.

    python benchmarks/gpu_compare.py BASE/gpu_bench.json HEAD/gpu_bench.json [--out reports/gpu-compare.md]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

# A TPOT more than this much above the base's is marked: the bar the graph-runtime issue set.
TOLERANCE = 0.03
_RUN = re.compile(r" \(run \d+\)$")


def tpots(run: dict) -> dict[tuple[str, str, int], list[float]]:
    """(section, configuration, c) -> the TPOTs of its repeats (rows named "... (run i)" are repeats)."""
    out: dict[tuple[str, str, int], list[float]] = {}
    for row in run["rows"]:
        if row.get("tpot_ms") is not None:
            out.setdefault((row["section"], _RUN.sub("", row["what"]), row["c"]), []).append(row["tpot_ms"])
    return out


def table(base: dict, head: dict) -> tuple[list[str], int]:
    """The comparison's rows, and how many of them are marked."""
    ours = tpots(head)
    lines, marked = [], 0
    for key, before in tpots(base).items():
        if key not in ours:
            continue
        section, what, c = key
        b, h = statistics.median(before), statistics.median(ours[key])
        # The mark reads the ratio as printed: a row that shows 1.030 is within a 3% bar, not above it by
        # a float's last bit.
        ratio = round(h / b, 3)
        worse = ratio > 1 + TOLERANCE
        marked += worse
        lines.append(f"| {section} | {what} | {c} | {len(before)} / {len(ours[key])} | {b:.3f} | {h:.3f} | "
                     f"{ratio:.3f}{' **slower**' if worse else ''} |")
    return lines, marked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("head", type=Path)
    parser.add_argument("--out", type=Path, default=Path("reports/gpu-compare.md"))
    args = parser.parse_args()
    try:
        base, head = (json.loads(p.read_text()) for p in (args.base, args.head))
    except (OSError, json.JSONDecodeError) as exc:
        sys.exit(f"gpu-compare: {exc}")
    rows, marked = table(base, head)
    if not rows:
        sys.exit("gpu-compare: the two runs share no TPOT row")
    device = head.get("device", "not recorded")
    args.out.write_text("\n".join([
        f"# {head['commit']} against {base['commit']} on one GPU: TPOT of the same configurations",
        "",
        # The head run's commit is the report's: the index dates it by that commit, not by the rendering's.
        f"Made by `make gpu-compare` (`{' '.join(['python', *sys.argv])}`) from the runs at commit {head['commit']} "
        f"and at base commit {base['commit']}, {head['date'][:10]}, on {device}.",
        "",
        f"Both runs are random qwen3-8b bf16 through `LLM.generate` (`benchmarks/gpu_bench.py`, sections "
        f"{', '.join(s for s in base['sections'] if s in head['sections'])}), one after the other on {device} "
        f"(base {base['date']}, head {head['date']}; Python {head['versions']['python']}, torch "
        f"{head['versions']['torch']}, triton {head['versions']['triton']}). TPOT in ms per output token, the "
        f"median over a configuration's repeats; **slower** marks a head TPOT more than {TOLERANCE:.0%} above the "
        f"base's. {marked} of {len(rows)} rows are marked.",
        "",
        "| section | configuration | c | repeats (base / head) | base TPOT | head TPOT | head / base |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]))
    print(f"wrote {args.out}: {marked} of {len(rows)} rows more than {TOLERANCE:.0%} slower")


if __name__ == "__main__":
    main()
