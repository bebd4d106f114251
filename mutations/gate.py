"""The mutmut score gate: a strict score over `mutmut export-cicd-stats`, failing below a threshold kept in the repo.

`mutmut run` exits 0 however many mutants survive, and mutmut's own badge counts a timeout as a kill (a
forked child hung in OpenMP looks like a kill). So the gate recomputes the score itself:

    score = killed / (killed + survived + timeout + suspicious + segfault + no_tests + not_checked)

mutmut 3.8's export (mutants/mutmut-cicd-stats.json) has keys killed, survived, total, no_tests, skipped,
suspicious, timeout, check_was_interrupted_by_user and segfault. "not checked" and "caught by type check"
have no key of their own but are in `total`; the gate counts that residual as not checked, which is exact
while no `type_check_command` is configured, and errs strict otherwise.

A scope (file globs such as `refengine/sample/*`) gates part of mutmut's selection: only its mutants run, and
the stats file is mutmut's own summary (`calculate_summary_stats`) over the matching source files, so the
mutants outside the scope, never run, are not counted as unchecked.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from mutations.procs import run_group

STATS_PATH = Path("mutants") / "mutmut-cicd-stats.json"

_KEYS = (
    "killed",
    "survived",
    "total",
    "no_tests",
    "skipped",
    "suspicious",
    "timeout",
    "check_was_interrupted_by_user",
    "segfault",
)


class GateError(ValueError):
    """Stats or threshold file missing or malformed: the gate cannot give a verdict."""


@dataclass(frozen=True)
class MutmutStats:
    killed: int
    survived: int
    total: int
    no_tests: int
    skipped: int
    suspicious: int
    timeout: int
    check_was_interrupted_by_user: int
    segfault: int

    @property
    def not_checked(self) -> int:
        labelled = sum(getattr(self, key) for key in _KEYS if key != "total")
        return self.total - labelled

    @property
    def scored(self) -> int:
        """Every mutant that counts in the denominator; skipped and interrupted ones are judged separately."""
        return (
            self.killed
            + self.survived
            + self.timeout
            + self.suspicious
            + self.segfault
            + self.no_tests
            + self.not_checked
        )

    @property
    def score(self) -> float:
        return self.killed / self.scored if self.scored else 0.0


@dataclass(frozen=True)
class Threshold:
    min_score: float
    max_timeouts: int


@dataclass
class GateVerdict:
    score: float
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def load_stats(path: Path) -> MutmutStats:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GateError(f"cannot read mutmut stats {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise GateError(f"{path}: expected a JSON object")
    values = {}
    for key in _KEYS:
        value = data.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise GateError(f"{path}: {key} must be a non-negative integer, got {value!r}")
        values[key] = value
    stats = MutmutStats(**values)
    if stats.not_checked < 0:
        raise GateError(f"{path}: total {stats.total} is less than the sum of the labelled buckets")
    return stats


def load_threshold(path: Path) -> Threshold:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        threshold = Threshold(min_score=float(data["min_score"]), max_timeouts=int(data["max_timeouts"]))
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise GateError(f"cannot read threshold {path}: {exc}") from exc
    if not 0.0 <= threshold.min_score <= 1.0 or threshold.max_timeouts < 0:
        raise GateError(f"{path}: min_score must lie in [0, 1] and max_timeouts must be >= 0")
    return threshold


def evaluate(stats: MutmutStats, threshold: Threshold) -> GateVerdict:
    verdict = GateVerdict(score=stats.score)
    if stats.check_was_interrupted_by_user:
        verdict.failures.append(
            f"{stats.check_was_interrupted_by_user} mutants were interrupted: the run is incomplete"
        )
    if stats.killed + stats.survived == 0:
        # A gate that is green with zero verdicts proves nothing.
        verdict.failures.append("no mutant was killed or survived: nothing was tested")
    if stats.score < threshold.min_score:
        verdict.failures.append(f"score {stats.score:.4f} is below the threshold {threshold.min_score:.4f}")
    if stats.timeout > threshold.max_timeouts:
        verdict.failures.append(
            f"{stats.timeout} timeouts exceed the cap of {threshold.max_timeouts} (forked children hang in "
            "OpenMP unless OMP_NUM_THREADS=1)"
        )
    return verdict


def mutmut_env() -> dict[str, str]:
    env = dict(os.environ)
    # mutmut forks each mutant from a parent that already ran the suite; with a multi-threaded OpenMP pool
    # there the children hang and are scored as timeouts. One thread is fast and correct.
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    return env


def mutant_patterns(scope: tuple[str, ...]) -> list[str]:
    """mutmut's mutant-name patterns for file globs: `refengine/sample/*` -> `refengine.sample.*`."""
    patterns = []
    for glob in scope:
        dotted = glob.removesuffix(".py").replace("/", ".")
        patterns.append(dotted if dotted.endswith("*") else dotted + ".*")
    return patterns


def export_scoped_stats(root: Path, scope: tuple[str, ...]) -> None:
    """Write STATS_PATH in `export-cicd-stats`'s format over the source files that match `scope` only."""
    # mutmut's own summary, so a scoped score counts exactly as `export-cicd-stats` would; imported here
    # because every other path drives mutmut as a subprocess.
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.stats import calculate_summary_stats

    mutants = root / "mutants"
    data = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        source = meta.relative_to(mutants).as_posix().removesuffix(".meta")
        if any(fnmatch.fnmatch(source, glob) for glob in scope):
            file_data = SourceFileMutationData(path=source)
            file_data.meta_path = meta  # mutmut's own path is relative to the working directory
            file_data.load()
            data[source] = file_data
    if not data:
        raise GateError(f"no mutated source file matches the scope {', '.join(scope)}")
    summary = calculate_summary_stats(data)
    (root / STATS_PATH).write_text(json.dumps({key: getattr(summary, key) for key in _KEYS}, indent=4))


def run_mutmut(root: Path, max_children: int, timeout_s: float | None, scope: tuple[str, ...] = ()) -> str | None:
    """Fresh `mutmut run` (and, unscoped, `export-cicd-stats`) in `root`. None on success, else why it failed.

    `mutants/` is removed first: mutmut does not retest survivors when only the tests changed. With a
    scope, only the mutants of those files run and no stats are written here.
    """
    shutil.rmtree(root / "mutants", ignore_errors=True)
    env = mutmut_env()
    mutmut = [sys.executable, "-m", "mutmut"]
    rc = run_group(
        [*mutmut, "run", "--max-children", str(max_children), *mutant_patterns(scope)],
        cwd=root,
        env=env,
        timeout_s=timeout_s,
    )
    if rc is None:
        return f"mutmut run did not finish within {timeout_s}s"
    if rc != 0:
        return f"mutmut run exited {rc} (red baseline, no covered mutants, or tests not importing mutants/)"
    if scope:
        return None  # the caller scores the scope with export_scoped_stats
    rc = run_group([*mutmut, "export-cicd-stats"], cwd=root, env=env, timeout_s=timeout_s)
    if rc != 0 or not (root / STATS_PATH).is_file():
        return f"mutmut export-cicd-stats exited {rc} without writing {STATS_PATH}"
    return None
