"""mutmut in a scratch copy of the tree whose [tool.mutmut] mutates only some files under some tests.

What mutmut copies (source_paths, tests/, also_copy) is copied, and pyproject.toml is rewritten with the
configured [tool.mutmut] and [tool.pytest.ini_options] but `only_mutate` and the test selection: the PR
gate and every shard run this way, each in its own scratch directory, so that they never touch the
tree or each other's `mutants/`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from mutations.gate import mutmut_env
from mutations.plan import PlannedMutant
from mutations.procs import run_group
from mutations.records import MutantRecord, read_meta
from mutations.tree import IGNORED, copied_entries, mutmut_sections, tree_digest


def _toml_value(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def write_scratch(root: Path, scratch: Path, paths: set[str], tests: list[str]) -> None:
    """A copy of what mutmut copies, with a pyproject whose [tool.mutmut] mutates `paths` under `tests`."""
    sections = mutmut_sections(root)
    config = dict(sections["tool.mutmut"])
    config.update(only_mutate=sorted(paths), pytest_add_cli_args_test_selection=tests)
    config.pop("do_not_mutate", None)  # the changed paths are in scope already
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    ignore = shutil.ignore_patterns(*IGNORED)
    for entry in copied_entries(config):
        source = root / entry
        if source.is_dir():
            shutil.copytree(source, scratch / entry, ignore=ignore)
        elif source.is_file():
            (scratch / entry).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, scratch / entry)
    sections["tool.mutmut"] = config
    text = "".join(
        f"[{name}]\n" + "".join(f"{key} = {_toml_value(value)}\n" for key, value in body.items()) + "\n"
        for name, body in sections.items()
    )
    (scratch / "pyproject.toml").write_text(text, encoding="utf-8")


def run_mutants(
    root: Path,
    scratch: Path,
    chosen: list[PlannedMutant],
    tests: list[str],
    max_children: int,
    timeout_s: float | None,
    every_mutant: bool = False,
) -> tuple[list[MutantRecord], str | None]:
    """Run `chosen` through mutmut in `scratch`; their records, and why the run failed if it did.

    `every_mutant`: `chosen` is every mutant of its files, so mutmut runs unfiltered (no name list).
    """
    paths = {m.path for m in chosen}
    tree = tree_digest(root)
    write_scratch(root, scratch, paths, tests)
    # `*NAME`: mutmut takes a pattern with a star as a glob (a plain name must have covering tests, or
    # mutmut stops with a KeyError); the leading star matches the empty prefix, so it selects NAME alone.
    patterns = [] if every_mutant else [f"*{m.name}" for m in chosen]
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
    records = [r for path in sorted(paths) for r in read_meta(scratch / "mutants", path, tree, names)]
    missing = names - {r.name for r in records}
    records += [MutantRecord(n, next(m.path for m in chosen if m.name == n), "not checked", 0.0, tree) for n in sorted(missing)]
    return sorted(records), None
