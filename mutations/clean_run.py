"""A pytest run's JUnit XML report on this same tree, read as the clean-tree verdict of focused tests.

`make test` runs the whole suite seconds before the named mutants. A mutant whose every focused test passed
in that run needs no clean-tree run of its own: the report already says its tests are green on this tree.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from mutations.pytest_run import covers

# A testcase with any of these children did not pass; pytest writes <skipped> for xfail too.
_NOT_PASSED = ("failure", "error", "skipped")


class CleanRunError(ValueError):
    """The report is missing, is not JUnit XML, or names tests that are not in this tree."""


@dataclass(frozen=True)
class CleanRun:
    outcomes: dict[str, bool]  # pytest node id -> every testcase reported under that id passed

    def passed(self, requested: str) -> bool:
        """Did everything the report ran under `requested` (a file, class, test or parametrisation) pass?

        A requested id with no testcase under it (deselected, say, as `slow`) has no verdict here.
        """
        under = [ok for node, ok in self.outcomes.items() if covers(requested, node)]
        return bool(under) and all(under)


def load_clean_run(path: Path, root: Path) -> CleanRun:
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError) as exc:
        raise CleanRunError(f"clean-run report {path}: {exc}") from exc
    top = tree.getroot()
    if top.tag not in ("testsuites", "testsuite"):
        raise CleanRunError(f"clean-run report {path}: <{top.tag}> is not a JUnit report")
    outcomes: dict[str, bool] = {}
    for case in top.iter("testcase"):
        classname, name = case.get("classname"), case.get("name")
        if classname is None or not name:
            raise CleanRunError(f"clean-run report {path}: a <testcase> without classname and name")
        nodes = node_ids(classname, name, root)
        if not nodes:
            raise CleanRunError(
                f"clean-run report {path}: testcase {classname}::{name} names no test file under {root}"
                " (a report of another tree?)"
            )
        passed = not any(child.tag in _NOT_PASSED for child in case)
        # One address that fits two files cannot vouch for either, so only an unambiguous one passes.
        passed = passed and len(nodes) == 1
        for node in nodes:
            outcomes[node] = outcomes.get(node, True) and passed
    return CleanRun(outcomes)


def node_ids(classname: str, name: str, root: Path) -> list[str]:
    """The pytest node ids a JUnit testcase can stand for, found by which dotted prefix is a path under root.

    pytest writes `tests/a/test_x.py::C::test_f[p]` as classname `tests.a.test_x.C` and name `test_f[p]`,
    and a collection error of `tests/a/test_x.py` as classname "" and name `tests.a.test_x`. A dot can
    come from a `/`, from a dotted directory name or from a class nesting, so every split is tried.
    """
    dotted, tail = (classname, [name]) if classname else (name, [])
    parts = dotted.split(".")
    return [path + "".join(f"::{p}" for p in [*parts[used:], *tail]) for path, used in _paths(root, parts, tail)]


def _paths(root: Path, parts: list[str], tail: list[str]) -> list[tuple[str, int]]:
    """(repo-relative path, parts used) for each .py file, or each directory that uses every part and has
    no test name after it, that a prefix of `parts` names under root."""
    found: list[tuple[str, int]] = []

    def walk(directory: Path, rel: tuple[str, ...], start: int) -> None:
        for end in range(start + 1, len(parts) + 1):
            segment = ".".join(parts[start:end])
            if not segment or segment.startswith("."):
                continue  # never "..": an address must not climb out of the root
            if (directory / f"{segment}.py").is_file():
                found.append(("/".join((*rel, f"{segment}.py")), end))
            if (directory / segment).is_dir():
                if end == len(parts) and not tail:
                    found.append(("/".join((*rel, segment)), end))
                walk(directory / segment, (*rel, segment), end)

    walk(root, (), 0)
    return found
