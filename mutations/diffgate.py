"""The PR-scoped mutmut gate: the mutants of the functions a change touched, and no unrecorded survivor.

mutmut runs in a scratch copy (.mutations/diff-gate/) whose [tool.mutmut] mutates only the changed files
and selects only the test files that import a changed module (all of the configured selection when none
does): the stats pass over the whole selection alone takes minutes on 2 cores. A mutant only a
farther test kills therefore survives here; kill it with a direct test, or record it.

Over budget (more mutants than --max-mutants), the gate runs a deterministic sample (the lowest sha256 of
the names, the same on every run) and says so on its verdict line; the rest are unchecked until the
full run (`make mutmut`) or `--max-mutants 0` (no cap).
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

from mutations.diffscope import ChangedFunction, MutmutScope, load_scope, module_name
from mutations.gate import GateError
from mutations.plan import PlannedMutant, plan_file
from mutations.records import KILLED, MutantRecord
from mutations.scratch import run_mutants
from mutations.survivors import RecordedSurvivor

SCRATCH = Path(".mutations") / "diff-gate"


def sample(mutants: list[PlannedMutant], max_mutants: int) -> list[PlannedMutant]:
    """At most `max_mutants` (0: all), chosen by the sha256 of the name: the same set on every run."""
    if not max_mutants or len(mutants) <= max_mutants:
        return mutants
    ranked = sorted(mutants, key=lambda m: hashlib.sha256(m.name.encode()).hexdigest())
    return sorted(ranked[:max_mutants])


def plan(root: Path, functions: list[ChangedFunction]) -> list[PlannedMutant]:
    by_path: dict[str, set[str]] = {}
    for f in functions:
        by_path.setdefault(f.path, set()).add(f.mangled)
    return sorted(m for path, names in sorted(by_path.items()) for m in plan_file(root, path, names))


def _imports(test_file: Path) -> set[str]:
    try:
        tree = ast.parse(test_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return set()
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def covering_tests(root: Path, scope: MutmutScope, paths: set[str]) -> list[str]:
    """The test files in the configured selection that import a changed module; all of it when none does."""
    modules = {module_name(p) for p in paths}
    files = []
    for entry in scope.test_selection:
        target = root / entry
        candidates = sorted(target.rglob("test_*.py")) if target.is_dir() else [target]
        files += [c.relative_to(root).as_posix() for c in candidates if _imports(c) & modules]
    return files or list(scope.test_selection)


def run_scoped(
    root: Path, chosen: list[PlannedMutant], scope: MutmutScope, max_children: int, timeout_s: float | None
) -> tuple[list[MutantRecord], str | None]:
    """Run `chosen` in the scratch copy, under the test files that import their modules."""
    paths = {m.path for m in chosen}
    return run_mutants(root, root / SCRATCH, chosen, covering_tests(root, scope, paths), max_children, timeout_s)


def judge(
    chosen: list[PlannedMutant], records: list[MutantRecord], survivors: dict[str, RecordedSurvivor]
) -> tuple[list[str], list[str]]:
    """(failures, excused): every mutant not killed fails unless recorded with a matching digest."""
    by_name = {m.name: m for m in chosen}
    failures, excused = [], []
    for record in records:
        mutant, entry = by_name[record.name], survivors.get(record.name)
        where = f"{record.name} [{mutant.digest}] ({mutant.change})"
        if record.status == KILLED:
            if entry is not None:
                failures.append(f"stale survivor entry: {record.name} is now killed; delete it from the file")
            continue
        if entry is None:
            failures.append(f"{record.status}: {where}")
        elif entry.digest != mutant.digest:
            failures.append(f"{record.status}: {where}: recorded for digest {entry.digest}, another mutation")
        else:
            excused.append(f"{record.status}, recorded {entry.reason}: {where}: {entry.note}")
    return failures, excused


def load_config_scope(root: Path) -> MutmutScope:
    try:
        return load_scope(root / "pyproject.toml")
    except ValueError as exc:
        raise GateError(str(exc)) from exc
