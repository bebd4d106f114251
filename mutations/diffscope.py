"""What a change touched, in mutmut's terms: the functions whose lines `git diff -U0 BASE` names.

A hunk's new-side lines are mapped onto the spans (`ast`, decorators included) of module-level functions
and the methods of module-level classes: the units mutmut 3.8 mutates and names (`x_f`, `xǁClassǁm`).
A pure deletion touches the line it left behind. Only files inside mutmut's configured scope
(`[tool.mutmut]` source_paths and only_mutate, minus do_not_mutate) count; a docs-only change touches nothing.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


class DiffError(ValueError):
    """The base is not a commit, git failed, or the mutmut configuration is unreadable."""


@dataclass(frozen=True)
class MutmutScope:
    source_paths: tuple[str, ...]
    only_mutate: tuple[str, ...]
    do_not_mutate: tuple[str, ...]
    test_selection: tuple[str, ...]

    def contains(self, path: str) -> bool:
        under = any(path.startswith(p.rstrip("/") + "/") for p in self.source_paths)
        inside = under and (not self.only_mutate or any(fnmatch.fnmatch(path, g) for g in self.only_mutate))
        return path.endswith(".py") and inside and not any(fnmatch.fnmatch(path, g) for g in self.do_not_mutate)


@dataclass(frozen=True, order=True)
class ChangedFunction:
    path: str  # repo-relative source file
    mangled: str  # mutmut's function name: x_f or xǁClassǁm

    @property
    def module(self) -> str:
        return module_name(self.path)


def module_name(path: str) -> str:
    """mutmut's dotted module of a source path (a package's __init__ is the package)."""
    return path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def load_scope(pyproject: Path) -> MutmutScope:
    try:
        config = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["mutmut"]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
        raise DiffError(f"cannot read [tool.mutmut] from {pyproject}: {exc}") from exc
    return MutmutScope(
        source_paths=tuple(config.get("source_paths", ())),
        only_mutate=tuple(config.get("only_mutate", ())),
        do_not_mutate=tuple(config.get("do_not_mutate", ())),
        test_selection=tuple(config.get("pytest_add_cli_args_test_selection", ())),
    )


def changed_lines(root: Path, base: str) -> dict[str, set[int]]:
    """New-side line numbers per changed file, from the base commit to the working tree."""
    try:
        diff = subprocess.run(
            ["git", "diff", "-U0", "--no-color", "--no-ext-diff", base, "--"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except subprocess.CalledProcessError as exc:
        raise DiffError(f"git diff against {base!r} failed: {exc.stderr.strip()}") from exc
    lines: dict[str, set[int]] = {}
    path: str | None = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            target = line[4:]
            path = target[2:] if target.startswith("b/") else None  # /dev/null: a deleted file
            continue
        match = _HUNK.match(line)
        if match and path is not None:
            start, count = int(match[1]), int(match[2] if match[2] is not None else 1)
            lines.setdefault(path, set()).update(range(start, start + max(count, 1)))
    return lines


def function_spans(source: str) -> dict[str, tuple[int, int]]:
    """mutmut's function names and their line spans (first decorator through the last line)."""
    spans: dict[str, tuple[int, int]] = {}

    def span(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int]:
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        return first, node.end_lineno or node.lineno

    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            spans[f"x_{node.name}"] = span(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    spans[f"xǁ{node.name}ǁ{item.name}"] = span(item)
    return spans


def changed_functions(root: Path, base: str, scope: MutmutScope) -> list[ChangedFunction]:
    """Every in-scope function that a line of the diff falls in, sorted."""
    found: set[ChangedFunction] = set()
    for path, lines in changed_lines(root, base).items():
        if not scope.contains(path) or not (root / path).is_file():
            continue
        try:
            spans = function_spans((root / path).read_text(encoding="utf-8"))
        except (SyntaxError, ValueError) as exc:
            raise DiffError(f"{path} does not parse: {exc}") from exc
        for name, (first, last) in spans.items():
            if any(first <= n <= last for n in lines):
                found.add(ChangedFunction(path, name))
    return sorted(found)


def default_base(root: Path) -> str:
    """The merge base with origin's default branch when there is one, else HEAD~1 (a fresh clone of main)."""

    def git(*args: str) -> str | None:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None

    default = git("symbolic-ref", "--quiet", "refs/remotes/origin/HEAD")
    if default is not None:
        base = git("merge-base", "HEAD", default)
        # On the default branch itself the merge base is HEAD: then the last commit is the change.
        if base is not None and base != git("rev-parse", "HEAD"):
            return base
    if git("rev-parse", "--verify", "--quiet", "HEAD~1") is None:
        raise DiffError("no base: HEAD has no parent and origin has no default branch")
    return "HEAD~1"
