"""Run focused pytest node ids in a subprocess of their own and read back per-test outcomes."""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mutations.preloaded import PreloadedPytest
from mutations.procs import run_group

_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$")


@dataclass(frozen=True)
class PytestRun:
    rc: int | None  # None when the run was killed at its deadline
    timed_out: bool
    duration_s: float
    passed: tuple[str, ...]  # node ids from the PASSED lines of the short summary
    failed: tuple[str, ...]  # FAILED and ERROR lines, "node id - message"
    output: str

    def failures_of(self, requested: tuple[str, ...]) -> list[str]:
        return [line for line in self.failed if any(covers(r, line) for r in requested)]

    def passes_of(self, requested_id: str) -> bool:
        return any(covers(requested_id, line) for line in self.passed)

    def tail(self, chars: int = 3000) -> str:
        return self.output[-chars:]


def covers(requested: str, reported: str) -> bool:
    """Does a summary line's node id fall under a requested node id (a file, class, test or parametrisation)?

    Matching on prefixes of the requested id, instead of splitting the line at " - ", stays right when a
    parametrisation id itself contains " - ".
    """
    if reported == requested:
        return True
    return any(reported.startswith(requested.rstrip("/") + sep) for sep in (" - ", "::", "[", "/"))


def focused_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        # A forked/threaded OpenMP pool can hang once torch has run; one thread keeps a hang a real verdict.
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        # No .pyc written from a mutant can outlive the mutant.
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",
        # The tests must import the tree being mutated, whatever else is installed.
        PYTHONPATH=os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p),
    )
    # Options from the caller's shell (-x, -n, --lf) would change which tests run and so the verdict.
    env.pop("PYTEST_ADDOPTS", None)
    return env


def run_pytest(
    root: Path,
    tests: tuple[str, ...],
    timeout_s: float,
    on_start: Callable[[int], None] | None = None,
    preloaded: PreloadedPytest | None = None,
) -> PytestRun:
    """Run `tests` from `root`; kill the whole process group at the deadline.

    No -x: a kill must be attributed to a named test, so every focused test has to report.
    `preloaded`: fork the run from that server (same environment) instead of starting an interpreter.
    """
    args = ["-q", "-rA", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]
    started = time.monotonic()
    with tempfile.NamedTemporaryFile() as sink:
        if preloaded is None:
            rc = run_group([sys.executable, "-m", "pytest", *args], cwd=root, env=focused_env(root),
                           timeout_s=timeout_s, stdout=sink, on_start=on_start)
        else:
            rc = preloaded.run(args, Path(sink.name), timeout_s, on_start=on_start)
        sink.seek(0)
        output = sink.read().decode("utf-8", errors="replace")
    passed, failed = parse_summary(output)
    return PytestRun(
        rc=rc,
        timed_out=rc is None,
        duration_s=time.monotonic() - started,
        passed=passed,
        failed=failed,
        output=output,
    )


def parse_summary(output: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Read PASSED/FAILED/ERROR lines after the last short-summary header.

    Only lines after the header count: captured test output printed earlier may contain look-alike lines.
    """
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if _SUMMARY_HEADER.match(line)]
    if not starts:
        return (), ()
    passed: list[str] = []
    failed: list[str] = []
    for line in lines[starts[-1] + 1 :]:
        word, _, rest = line.partition(" ")
        if word == "PASSED":
            passed.append(rest)
        elif word in ("FAILED", "ERROR"):
            failed.append(rest)
    return tuple(passed), tuple(failed)
