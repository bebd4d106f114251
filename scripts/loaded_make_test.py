"""reports/loaded-make-test.md: `make test` passes twice in a row on a machine loaded by a parallel `make test`,
with no assertion depending on wall time or CPU share.

Two checkouts of HEAD (git worktrees in a temporary folder, each with its own copy of the named mutations,
`PYTHONPATH` pointing at it, the same virtual environment): A runs `make test` --runs times in a row; B runs
`make test` alongside, as many times as A and none after A ends (one more, begun near A's end, would load little
of A and hold the report for a whole run). Each run's exit status, wall time, pytest summary and named-mutation
summary go into the report. About 50 minutes on 2 cores.

    python scripts/loaded_make_test.py [--runs 2] [--out reports/loaded-make-test.md]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ladder.host import provenance
from ladder.own_version import build

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.executable).parent.parent


@dataclass
class Run:
    name: str
    rc: int
    wall_s: float
    pytest: str
    mutations: str


def make_test(tree: Path, name: str, logs: Path) -> Run:
    """`make test` in `tree` on this Python's virtual environment (`-o` keeps make from reinstalling it)."""
    stamp = VENV / ".installed"
    log = logs / f"{name}.log"
    start = time.perf_counter()
    with log.open("w") as out:
        rc = subprocess.run(["make", f"VENV={VENV}", "-o", str(stamp), "test"], cwd=tree, stdout=out,
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(tree)}).returncode
    wall = time.perf_counter() - start
    text = log.read_text(errors="replace")
    pytest = re.findall(r"^=*\s*(\d[\d,]* (?:passed|failed).*? in [\d.]+s)", text, re.M)
    named = re.findall(r"named-mutations: \d+ passed, \d+ failed", text)
    print(f"{name}: rc {rc}, {wall:.0f} s", flush=True)
    return Run(name, rc, wall, pytest[0] if pytest else "-", named[-1] if named else "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="make test runs of tree A in a row")
    parser.add_argument("--out", type=Path, default=ROOT / "reports/loaded-make-test.md")
    args = parser.parse_args()
    header = provenance("loaded-test-report")
    commit = build().commit
    if commit is None:
        sys.exit("loaded-test-report: run it from a git checkout of specladder (its two trees are worktrees of HEAD)")
    with tempfile.TemporaryDirectory(prefix="loaded-make-test-") as tmp:
        trees = {name: Path(tmp) / name for name in "AB"}
        for tree in trees.values():
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, check=True)
        try:
            a_runs: list[Run] = []
            b_runs: list[Run] = []
            a_done = threading.Event()

            def tree_b() -> None:
                while not a_done.is_set() and len(b_runs) < args.runs:
                    b_runs.append(make_test(trees["B"], f"B{len(b_runs) + 1}", Path(tmp)))

            b = threading.Thread(target=tree_b)
            b.start()
            for i in range(args.runs):
                a_runs.append(make_test(trees["A"], f"A{i + 1}", Path(tmp)))
            a_done.set()
            b.join()
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
    load = os.getloadavg()[0]
    passed = all(r.rc == 0 for r in a_runs + b_runs)
    lines = [
        "# `make test` on a machine loaded by a parallel `make test`", "",
        header, f"The figures are from commit {commit}; a later commit reruns them with `make loaded-test-report` "
        "(about 50 minutes of both cores).", "",
        f"`make test` must pass {args.runs} times in a row on a machine loaded by a parallel `make test`, with no "
        "assertion depending on wall time or CPU share. Tree A and tree B are two checkouts of the commit (git "
        "worktrees, each with its own copy of the named mutations, `PYTHONPATH` pointing at it, the same virtual "
        f"environment). A runs `make test` {args.runs} times in a row; B runs `make test` alongside as many times, "
        "starting none after A ends.", "",
        "| run | exit status | pytest | named mutations | wall |",
        "|---|---|---|---|---|",
        *(f"| {r.name} | {r.rc} | {r.pytest} | {r.mutations} | {r.wall_s:,.0f} s |" for r in a_runs + b_runs), "",
        f"Result: {'every run passed' if passed else 'FAILED: a run above exited non-zero'}. 1-minute load average "
        f"{load:.1f} at the end.", ""]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
