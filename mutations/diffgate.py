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
import json
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from mutations.diffscope import ChangedFunction, MutmutScope, load_scope, module_name
from mutations.gate import GateError, mutmut_env
from mutations.plan import PlannedMutant, plan_file
from mutations.procs import run_group
from mutations.records import KILLED, MutantRecord, read_meta
from mutations.survivors import RecordedSurvivor

SCRATCH = Path(".mutations") / "diff-gate"


@dataclass
class DiffVerdict:
    planned: int
    ran: list[MutantRecord] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    excused: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


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


def _toml_value(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def write_scratch(root: Path, scratch: Path, paths: set[str], tests: list[str]) -> None:
    """A copy of what mutmut copies, with a pyproject whose [tool.mutmut] mutates `paths` under `tests`."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    config = dict(pyproject["tool"]["mutmut"])
    config.update(only_mutate=sorted(paths), pytest_add_cli_args_test_selection=tests)
    config.pop("do_not_mutate", None)  # the changed paths are in scope already
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for entry in {*config.get("source_paths", []), "tests", *config.get("also_copy", [])}:
        source = root / entry
        if source.is_dir():
            shutil.copytree(source, scratch / entry, ignore=ignore)
        elif source.is_file():
            (scratch / entry).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, scratch / entry)
    sections = {"tool.mutmut": config, "tool.pytest.ini_options": pyproject["tool"].get("pytest", {}).get("ini_options", {})}
    text = "".join(
        f"[{name}]\n" + "".join(f"{key} = {_toml_value(value)}\n" for key, value in body.items()) + "\n"
        for name, body in sections.items()
    )
    (scratch / "pyproject.toml").write_text(text, encoding="utf-8")


def run_scoped(root: Path, chosen: list[PlannedMutant], scope: MutmutScope, max_children: int, timeout_s: float | None) -> tuple[list[MutantRecord], str | None]:
    """Run `chosen` through mutmut in the scratch copy; their records, and why the run failed if it did."""
    paths = {m.path for m in chosen}
    scratch = root / SCRATCH
    write_scratch(root, scratch, paths, covering_tests(root, scope, paths))
    # `*NAME`: mutmut takes a pattern with a star as a glob (a plain name must have covering tests, or
    # mutmut stops with a KeyError); the leading star matches the empty prefix, so it selects NAME alone.
    patterns = [f"*{m.name}" for m in chosen]
    rc = run_group(
        [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *patterns],
        cwd=scratch,
        env=mutmut_env(),
        timeout_s=timeout_s,
    )
    if rc is None:
        return [], f"mutmut run did not finish within {timeout_s}s"
    if rc != 0:
        return [], f"mutmut run exited {rc} (red baseline, or tests not importing mutants/)"
    names = {m.name for m in chosen}
    records = [r for path in sorted(paths) for r in read_meta(scratch / "mutants", path, names)]
    missing = names - {r.name for r in records}
    records += [MutantRecord(n, next(m.path for m in chosen if m.name == n), "not checked", 0.0) for n in sorted(missing)]
    return sorted(records), None


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
