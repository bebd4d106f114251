"""Run named mutants one at a time, in place: green baseline, mutate, focused tests, verified restore.

The green baseline is a clean-tree run of the mutant's focused tests, unless a clean-run report (a JUnit
report of a pytest run on this same tree) already has every one of them passing.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mutations.clean_run import CleanRun
from mutations.files import RestoreWriter, purge_bytecode, restore_snapshot, take_snapshot, write_in_place
from mutations.journal import Journal
from mutations.model import Mutant, MutantResult, Status
from mutations.mutate import MutantRejected, mutate_source
from mutations.preloaded import PreloadedPytest
from mutations.pytest_run import PytestRun, focused_env, run_pytest


class JournalPending(RuntimeError):
    """A journal from an interrupted run exists: its target may still be mutated, so nothing may run."""


@dataclass(frozen=True)
class ApplyCheck:
    """check-apply's verdict on one mutant: status is None when it applies, compiles and its test files exist."""

    id: str
    status: Status | None
    detail: str


def check_apply(mutants: tuple[Mutant, ...], root: Path) -> list[ApplyCheck]:
    """The fast drift check: no tests run and nothing is written."""
    checks = []
    for mutant in mutants:
        target = root / mutant.file
        missing = sorted({t.split("::")[0] for t in mutant.tests if not (root / t.split("::")[0]).exists()})
        if not target.is_file():
            checks.append(
                ApplyCheck(mutant.id, Status.DOES_NOT_APPLY, f"target {mutant.file} does not exist")
            )
        elif missing:
            # The baseline would be red (pytest rc 4), so this is the static half of PRE_RED.
            checks.append(ApplyCheck(mutant.id, Status.PRE_RED, f"focused test files missing: {missing}"))
        else:
            try:
                mutate_source(mutant, target.read_bytes())
            except MutantRejected as exc:
                checks.append(ApplyCheck(mutant.id, exc.status, exc.detail))
            else:
                checks.append(ApplyCheck(mutant.id, None, "applies once and compiles"))
    return checks


class Runner:
    """Runs mutants in order. A RESTORE_FAILED aborts the rest (INCOMPLETE): the tree can no longer be trusted."""

    def __init__(
        self,
        root: Path,
        state_dir: Path,
        *,
        budget_s: float | None = None,
        restore_writer: RestoreWriter = write_in_place,
        on_result: Callable[[MutantResult], None] | None = None,
        clean_run: CleanRun | None = None,
        preload: tuple[str, ...] | None = None,
    ) -> None:
        self.root = root
        self.clean_run = clean_run
        # None: each focused run starts an interpreter; a tuple: each is forked from a server that imported it.
        self.preload = preload
        self._preloaded: PreloadedPytest | None = None
        self.journal = Journal(state_dir)
        self.budget_s = budget_s
        self.restore_writer = restore_writer
        self.on_result = on_result
        self._baselines: dict[tuple[str, ...], PytestRun] = {}
        self._deadline: float | None = None

    def run(self, mutants: tuple[Mutant, ...]) -> list[MutantResult]:
        if self.journal.exists():
            raise JournalPending(
                f"{self.journal.path} exists: a previous run was interrupted mid-mutation; run `mutations restore`"
            )
        self._deadline = None if self.budget_s is None else time.monotonic() + self.budget_s
        if self.preload is not None:
            self._preloaded = PreloadedPytest(self.root, focused_env(self.root), self.preload)
        results: list[MutantResult] = []
        aborted = False
        try:
            for mutant in mutants:
                if aborted:
                    result = _result(mutant, Status.INCOMPLETE, "not run: an earlier restore failed")
                elif self._remaining() == 0.0:
                    result = _result(mutant, Status.INCOMPLETE, "not run: the run's time budget is spent")
                else:
                    started = time.monotonic()
                    result = self._run_one(mutant)
                    result.duration_s = round(time.monotonic() - started, 3)
                aborted = aborted or result.status is Status.RESTORE_FAILED
                results.append(result)
                if self.on_result is not None:
                    self.on_result(result)
        finally:
            if self._preloaded is not None:
                self._preloaded.close()
                self._preloaded = None
        return results

    def _remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def _timeout_for(self, mutant: Mutant) -> tuple[float, bool]:
        """The run's timeout, and whether it is the budget (not the mutant's own limit) that sets it."""
        remaining = self._remaining()
        if remaining is not None and remaining < mutant.timeout_s:
            return remaining, True
        return mutant.timeout_s, False

    def _run_one(self, mutant: Mutant) -> MutantResult:
        target = self.root / mutant.file
        if not target.is_file():
            return _result(mutant, Status.DOES_NOT_APPLY, f"target {mutant.file} does not exist")
        # Check that the mutant applies before paying for a baseline run it could not use.
        try:
            mutate_source(mutant, target.read_bytes())
        except MutantRejected as exc:
            return _result(mutant, exc.status, exc.detail)
        # must_fail is a subset of tests (the catalogue checks it), so a report with every focused test
        # passing has the must_fail ones passing too: the clean-tree run could only agree with it.
        from_report = self.clean_run is not None and all(self.clean_run.passed(t) for t in mutant.tests)
        if not from_report:
            red = self._baseline_verdict(mutant)
            if red is not None:
                return red
        result = self._mutate_and_test(mutant, target)
        result.clean_run_skipped = from_report
        return result

    def _baseline_verdict(self, mutant: Mutant) -> MutantResult | None:
        key = mutant.tests
        baseline = self._baselines.get(key)
        if baseline is None:
            timeout, by_budget = self._timeout_for(mutant)
            baseline = run_pytest(self.root, mutant.tests, timeout, preloaded=self._preloaded)
            if baseline.timed_out and by_budget:
                return _result(mutant, Status.INCOMPLETE, "budget spent during the clean-tree run")
            self._baselines[key] = baseline
        if baseline.timed_out:
            return _result(
                mutant, Status.PRE_RED, f"focused tests timed out on the clean tree ({mutant.timeout_s}s)"
            )
        if baseline.rc != 0:
            return _result(
                mutant,
                Status.PRE_RED,
                f"focused tests are red on the clean tree (pytest rc {baseline.rc})",
                run=baseline,
            )
        not_passing = [t for t in mutant.must_fail if not baseline.passes_of(t)]
        if not_passing:
            return _result(
                mutant,
                Status.PRE_RED,
                f"must-fail tests did not pass on the clean tree (skipped or not collected): {not_passing}",
                run=baseline,
            )
        return None

    def _mutate_and_test(self, mutant: Mutant, target: Path) -> MutantResult:
        # Snapshot right before writing: the tree may have changed while the baseline ran.
        snapshot = take_snapshot(target)
        try:
            mutated = mutate_source(mutant, snapshot.data)
        except MutantRejected as exc:
            return _result(mutant, exc.status, exc.detail)
        timeout, by_budget = self._timeout_for(mutant)
        self.journal.record(mutant.id, snapshot)
        try:
            write_in_place(target, mutated)
            purge_bytecode(target)
            run = run_pytest(
                self.root, mutant.tests, timeout, on_start=self.journal.note_test_group, preloaded=self._preloaded
            )
        finally:
            # Runs on interrupts too; the journal stays whenever the pre-image is not verifiably back.
            with _signals_deferred():
                try:
                    sha_after = restore_snapshot(snapshot, self.restore_writer)
                except OSError:
                    sha_after = ""
                if sha_after == snapshot.sha256:
                    self.journal.clear()
        result = _classify(mutant, run, by_budget)
        result.sha256_before, result.sha256_after = snapshot.sha256, sha_after
        if sha_after != snapshot.sha256:
            result.status = Status.RESTORE_FAILED
            result.detail = (
                f"{mutant.file} differs from its pre-image after restore (sha256 {sha_after[:12] or 'unreadable'} "
                f"!= {snapshot.sha256[:12]}); journal kept, run `mutations restore`"
            )
        return result


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while the pre-image goes back, so an interrupt lands after the restore
    instead of tearing it in half."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _classify(mutant: Mutant, run: PytestRun, by_budget: bool) -> MutantResult:
    if run.timed_out:
        if by_budget:
            return _result(mutant, Status.INCOMPLETE, "budget spent while the mutant's tests ran", run=run)
        return _result(mutant, Status.TIMEOUT, f"focused tests ran past {mutant.timeout_s}s", run=run)
    if run.rc == 0:
        return _result(mutant, Status.SURVIVED, "every focused test passed against the mutant", run=run)
    if run.rc == 1:
        killers = run.failures_of(mutant.must_fail)
        if killers:
            return _result(mutant, Status.KILLED, "killed by a named test", run=run, keep_output=False)
        return _result(mutant, Status.KILLED_BY_WRONG_TEST, "tests failed, but none of must_fail", run=run)
    # rc 2-5 (interrupted, internal error, usage error, nothing collected) or a signal: no verdict.
    return _result(mutant, Status.ERROR, f"pytest exited {run.rc}", run=run)


def _result(
    mutant: Mutant, status: Status, detail: str, *, run: PytestRun | None = None, keep_output: bool = True
) -> MutantResult:
    result = MutantResult(id=mutant.id, title=mutant.title, status=status, detail=detail)
    if run is not None:
        result.pytest_rc = run.rc
        result.failed_tests = [line.split(" - ", 1)[0] for line in run.failed]
        # Kills need no transcript; anything else is a failure someone has to read.
        result.output_tail = run.tail() if keep_output else ""
    return result
