"""The data the named-mutation runner works on: catalogue entries, statuses and per-mutant results."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path


class Status(enum.StrEnum):
    """How one named mutant ended. Only KILLED passes the gate; every other status is red."""

    KILLED = "KILLED"
    SURVIVED = "SURVIVED"
    DOES_NOT_APPLY = "DOES_NOT_APPLY"
    INVALID_MUTANT = "INVALID_MUTANT"
    PRE_RED = "PRE_RED"
    TIMEOUT = "TIMEOUT"
    KILLED_BY_WRONG_TEST = "KILLED_BY_WRONG_TEST"
    ERROR = "ERROR"
    INCOMPLETE = "INCOMPLETE"
    RESTORE_FAILED = "RESTORE_FAILED"


@dataclass(frozen=True)
class Edit:
    """One exact-text replacement. `old` must occur exactly once in the file at the time it is applied."""

    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    """One hand-named mutant: a single bug, the invariant it breaks, and the tests that must catch it."""

    id: str
    title: str
    invariant: str
    file: str  # repo-relative path of the target
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]  # pytest node ids run against the mutant
    must_fail: tuple[str, ...]  # the subset of `tests` whose failure counts as a kill
    timeout_s: float


@dataclass(frozen=True)
class Catalogue:
    path: Path
    mutants: tuple[Mutant, ...]
    # [defaults] preload: the third-party modules focused runs are forked after importing (mutations/preloaded.py);
    # None (no key): each focused run starts an interpreter of its own.
    preload: tuple[str, ...] | None = None

    def get(self, mutant_id: str) -> Mutant | None:
        return next((m for m in self.mutants if m.id == mutant_id), None)


@dataclass
class MutantResult:
    """What the runner learned about one mutant; serialised as one entry of the JSON report."""

    id: str
    title: str
    status: Status
    detail: str = ""
    pytest_rc: int | None = None
    duration_s: float = 0.0
    failed_tests: list[str] = field(default_factory=list)
    sha256_before: str = ""
    sha256_after: str = ""
    output_tail: str = ""
    clean_run_skipped: bool = False  # the clean-run report, not a clean-tree run, said the focused tests pass

    @property
    def passed(self) -> bool:
        return self.status is Status.KILLED
