"""benchmarks/gpu_compare.py: the side-by-side TPOT table of a base run and a head run of gpu_bench.py. The
inputs are gpu_bench.json files as gpu_bench writes them (rows, sections, device, versions, commit, date);
the comparison is a pure function of the two, so small hand-made runs pin its arithmetic and its marks."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_compare.py"


def run(commit: str, rows: list[dict]) -> dict:
    return {"commit": commit, "date": "2026-12-08 01:00:00", "device": "NVIDIA H200",
            "versions": {"python": "3.12.3", "torch": "2.11.0", "triton": "3.5.0"},
            "sections": {"engine": {"status": "ok"}, "async_ab": {"status": "ok"}}, "rows": rows}


def row(section: str, what: str, c: int, tpot: float | None) -> dict:
    return {"section": section, "what": what, "c": c, "tpot_ms": tpot}


BASE = run("aaaaaaa", [
    row("engine", "graphs, async", 1, 10.0),
    row("engine", "graphs, async", 32, 20.0),
    # three repeats: the median (4.0) is compared, not the mean (5.0) or the first (3.0)
    *(row("async_ab", "EAGLE k=4, async on (run %d)" % i, 8, t) for i, t in ((1, 3.0), (2, 4.0), (3, 8.0))),
    row("engine", "only in the base", 1, 5.0),
    row("bandwidth", "no TPOT here", 1, None),
])
HEAD = run("bbbbbbb", [
    row("engine", "graphs, async", 1, 10.3),  # exactly 3% slower: within the bar
    row("engine", "graphs, async", 32, 20.7),  # 3.5% slower: marked
    *(row("async_ab", "EAGLE k=4, async on (run %d)" % i, 8, t) for i, t in ((1, 3.9), (2, 4.2), (3, 4.0))),
    row("engine", "only in the head", 1, 1.0),
])


def compare(tmp_path: Path, base: dict, head: dict) -> subprocess.CompletedProcess:
    for name, data in (("base.json", base), ("head.json", head)):
        (tmp_path / name).write_text(json.dumps(data))
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "base.json"), str(tmp_path / "head.json"),
                           "--out", str(tmp_path / "out.md")], capture_output=True, text=True, timeout=60)


def table_rows(report: str) -> dict[tuple[str, str, str], list[str]]:
    cells = [line.strip("|").split(" | ") for line in report.splitlines() if line.startswith("| ")][1:]
    return {(c[0].strip(), c[1], c[2]): [x.strip() for x in c[3:]] for c in cells}


def test_rows_both_runs_have_compare_their_medians_and_only_the_slower_is_marked(tmp_path: Path) -> None:
    done = compare(tmp_path, BASE, HEAD)
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "out.md").read_text()
    rows = table_rows(report)
    assert set(rows) == {("engine", "graphs, async", "1"), ("engine", "graphs, async", "32"),
                         ("async_ab", "EAGLE k=4, async on", "8")}
    assert rows[("engine", "graphs, async", "1")] == ["1 / 1", "10.000", "10.300", "1.030"]
    assert rows[("engine", "graphs, async", "32")] == ["1 / 1", "20.000", "20.700", "1.035 **slower**"]
    assert rows[("async_ab", "EAGLE k=4, async on", "8")] == ["3 / 3", "4.000", "4.000", "1.000"]
    assert "1 of 3 rows are marked" in report
    assert "bbbbbbb against aaaaaaa" in report and "NVIDIA H200" in report
    assert "1 of 3 rows more than 3% slower" in done.stdout


def test_bad_input_is_one_line_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "base.json").write_text("{not json")
    (tmp_path / "head.json").write_text(json.dumps(HEAD))
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "base.json"), str(tmp_path / "head.json"),
                           "--out", str(tmp_path / "out.md")], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.startswith("gpu-compare: ") and len(done.stderr.strip().splitlines()) == 1
    disjoint = compare(tmp_path, run("a", [row("engine", "x", 1, 1.0)]), run("b", [row("engine", "y", 1, 1.0)]))
    assert disjoint.returncode != 0 and disjoint.stderr.strip() == "gpu-compare: the two runs share no TPOT row"
    assert not (tmp_path / "out.md").exists()
