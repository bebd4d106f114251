"""Named mutants over several copies of the tree at once.

The runner mutates files in place, so two mutants can only run at the same time in two trees. Each
worker gets its own copy of the repository (the runner puts that copy first on the tests' PYTHONPATH)
and a share of the mutants; the original tree is never mutated. Each mutant's focused tests run on
one thread, so N workers use N cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mutations.model import Mutant, MutantResult, Status

# Not needed by any focused test, and large or private to the original tree.
_NOT_COPIED = (".git", ".venv", ".mutations", "mutants", ".pytest_cache", ".ruff_cache", "__pycache__", "runs")


def partition(mutants: Sequence[Mutant], jobs: int) -> list[tuple[Mutant, ...]]:
    """Round robin, so that the catalogue's neighbours (often the same file and tests) spread out."""
    groups = [tuple(mutants[i::jobs]) for i in range(jobs)]
    return [g for g in groups if g]


def run_parallel(
    root: Path, catalogue_path: Path, mutants: Sequence[Mutant], jobs: int, clean_run: Path | None = None
) -> list[MutantResult]:
    """Runs each share in its own copy; results come back in catalogue order.

    A clean-run report of the tree holds for each copy: a copy has the same test files, so the report's
    testcases name the same tests there.
    """
    with tempfile.TemporaryDirectory(prefix="named-mutations-") as scratch:
        procs = []
        for i, group in enumerate(partition(mutants, jobs)):
            copy = Path(scratch) / f"tree{i}"
            shutil.copytree(root, copy, ignore=shutil.ignore_patterns(*_NOT_COPIED), symlinks=True)
            catalogue = _in_copy(catalogue_path, root, copy)
            report = copy / "report.json"
            cmd = [sys.executable, "-c", "from mutations.cli import main; main()", "--root", str(copy), "--catalogue", str(catalogue), "run"]
            cmd += [arg for m in group for arg in ("--only", m.id)] + ["--report", str(report)]
            if clean_run is not None:
                cmd += ["--clean-run", str(clean_run.resolve())]
            # The copy's own packages first, for the runner itself too (its pytest runs add the copy anyway).
            # MUTATIONS_ORIGIN: the copy has no .git, so a test that reads the history (the reports index's
            # freshness counts) reads the original tree's, which has the same HEAD.
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(copy), os.environ.get("PYTHONPATH")) if p),
                   "MUTATIONS_ORIGIN": str(root.resolve())}
            log = (Path(scratch) / f"tree{i}.log").open("w")
            procs.append((group, report, log, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)))
        by_id: dict[str, MutantResult] = {}
        for group, report, log, proc in procs:
            proc.wait()
            log.close()
            by_id.update(_read(report, group, Path(log.name)))
    return [by_id[m.id] for m in mutants]


def _in_copy(path: Path, root: Path, copy: Path) -> Path:
    """A catalogue inside the tree is read from the copy; one kept elsewhere is read where it is."""
    try:
        return copy / path.resolve().relative_to(root.resolve())
    except ValueError:
        return path


def _read(report: Path, group: Sequence[Mutant], log: Path) -> dict[str, MutantResult]:
    if not report.is_file():
        # The worker died before writing its report: every mutant it held is unaccounted for.
        tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
        return {m.id: MutantResult(m.id, m.title, Status.ERROR, "worker wrote no report", output_tail=tail) for m in group}
    entries = json.loads(report.read_text(encoding="utf-8"))["mutants"]
    found = {e["id"]: MutantResult(**{**e, "status": Status(e["status"])}) for e in entries}
    missing = {m.id: MutantResult(m.id, m.title, Status.ERROR, "missing from its worker's report") for m in group}
    return missing | found
