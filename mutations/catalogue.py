"""Load and validate the named-mutation catalogue (one TOML file, parsed with the stdlib's tomllib).

Format, one table per mutant:

    [defaults]
    timeout_s = 300
    preload = ["torch"]     # optional: third-party modules imported once, before each focused run is forked

    [[mutant]]
    id = "M2"
    title = "the placeholder count is not decremented by the rejected drafts"   # phrased as the bug
    invariant = "placeholders == proposed - rejected"
    file = "refengine/core/scheduler.py"
    old = "        req.num_output_placeholders -= num_rejected\\n"            # must occur exactly once
    new = ""
    # ...or, instead of old/new, an inline unified diff (each hunk's old side must occur exactly once):
    # patch = '''@@ ... @@ ...'''
    tests = ["tests/core/test_async_scheduler.py::test_placeholders_track_rejections"]
    must_fail = ["tests/core/test_async_scheduler.py::test_placeholders_track_rejections"]
    timeout_s = 120                                                          # optional, else [defaults]
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from mutations.model import Catalogue, Edit, Mutant

DEFAULT_TIMEOUT_S = 300.0

_REQUIRED = ("id", "title", "invariant", "file", "tests", "must_fail")
_OPTIONAL = ("old", "new", "patch", "timeout_s")


class CatalogueError(ValueError):
    """The catalogue is malformed; nothing is run, because a bad entry cannot give a verdict."""


def load_catalogue(path: Path) -> Catalogue:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CatalogueError(f"{path}: {exc}") from exc
    unknown = set(data) - {"defaults", "mutant"}
    if unknown:
        raise CatalogueError(f"{path}: unknown top-level keys {sorted(unknown)}")
    default_timeout = float(data.get("defaults", {}).get("timeout_s", DEFAULT_TIMEOUT_S))
    preload = data.get("defaults", {}).get("preload")
    if preload is not None and not (isinstance(preload, list) and all(isinstance(m, str) and m for m in preload)):
        raise CatalogueError(f"{path}: [defaults] preload must be a list of module names")
    mutants = tuple(_parse_mutant(entry, default_timeout) for entry in data.get("mutant", []))
    seen: set[str] = set()
    for mutant in mutants:
        if mutant.id in seen:
            raise CatalogueError(f"{path}: duplicate mutant id {mutant.id!r}")
        seen.add(mutant.id)
    return Catalogue(path=path, mutants=mutants, preload=None if preload is None else tuple(preload))


def _parse_mutant(entry: dict[str, Any], default_timeout: float) -> Mutant:
    label = entry.get("id", "<no id>")
    missing = [key for key in _REQUIRED if key not in entry]
    if missing:
        raise CatalogueError(f"mutant {label}: missing keys {missing}")
    unknown = set(entry) - set(_REQUIRED) - set(_OPTIONAL)
    if unknown:
        raise CatalogueError(f"mutant {label}: unknown keys {sorted(unknown)}")
    for key in ("id", "title", "invariant", "file"):
        if not isinstance(entry[key], str) or not entry[key].strip():
            raise CatalogueError(f"mutant {label}: {key} must be a non-empty string")
    if not entry["file"].endswith((".py", ".md")):
        # A Python source (the validity check compiles it) or a generated document that a check guards
        # (reports/README.md, edited by hand, must turn the reports index's test red).
        raise CatalogueError(f"mutant {label}: file must be a .py source or a .md document")
    tests = _string_list(entry, "tests", label)
    must_fail = _string_list(entry, "must_fail", label)
    if not tests or not must_fail:
        raise CatalogueError(f"mutant {label}: tests and must_fail must be non-empty")
    strays = [t for t in must_fail if t not in tests]
    if strays:
        raise CatalogueError(f"mutant {label}: must_fail entries not in tests: {strays}")
    timeout = float(entry.get("timeout_s", default_timeout))
    if timeout <= 0:
        raise CatalogueError(f"mutant {label}: timeout_s must be positive")
    return Mutant(
        id=entry["id"],
        title=entry["title"],
        invariant=entry["invariant"],
        file=entry["file"],
        edits=_parse_edits(entry, label),
        tests=tests,
        must_fail=must_fail,
        timeout_s=timeout,
    )


def _string_list(entry: dict[str, Any], key: str, label: str) -> tuple[str, ...]:
    value = entry[key]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise CatalogueError(f"mutant {label}: {key} must be a list of non-empty strings")
    return tuple(value)


def _parse_edits(entry: dict[str, Any], label: str) -> tuple[Edit, ...]:
    has_text = "old" in entry or "new" in entry
    if has_text == ("patch" in entry):
        raise CatalogueError(f"mutant {label}: give either old/new or patch, not both or neither")
    if "patch" in entry:
        return parse_unified_patch(entry["patch"], label)
    if not isinstance(entry.get("old"), str) or not isinstance(entry.get("new"), str):
        raise CatalogueError(f"mutant {label}: old and new must both be strings")
    if not entry["old"]:
        raise CatalogueError(f"mutant {label}: old must not be empty (it locates the mutation)")
    return (Edit(old=entry["old"], new=entry["new"]),)


def parse_unified_patch(patch: str, label: str) -> tuple[Edit, ...]:
    """Turn each hunk into an exact-text Edit (old side -> new side).

    Hunk line numbers are ignored on purpose: the hunk's old side (context plus removed lines) must occur
    exactly once, so a drifted target fails loudly instead of being patched at a fuzzy offset.
    """
    hunks: list[tuple[list[str], list[str]]] = []
    last_kind = " "
    # Split on "\n" only: str.splitlines would also break on form feeds and other separators in source.
    for raw in re.findall(r"[^\n]*\n|[^\n]+$", patch):
        if raw.startswith("@@"):
            hunks.append(([], []))
            continue
        if not hunks:
            continue  # file headers (diff/index/---/+++) before the first hunk carry nothing we use
        old_side, new_side = hunks[-1]
        if raw.startswith("\\"):
            # "\ No newline at end of file" applies to the line just before it, on the side(s) it was on.
            for side in {"-": (old_side,), "+": (new_side,)}.get(last_kind, (old_side, new_side)):
                if side:
                    side[-1] = side[-1].rstrip("\r\n")
            continue
        kind = raw[:1]
        if kind == "-":
            old_side.append(raw[1:])
        elif kind == "+":
            new_side.append(raw[1:])
        elif kind == " " or not raw.strip("\r\n"):
            # Editors often strip the lone space of a blank context line; treat an empty line as context.
            body = raw[1:] if kind == " " else raw
            old_side.append(body)
            new_side.append(body)
            kind = " "
        else:
            raise CatalogueError(f"mutant {label}: patch line not understood: {raw.rstrip()!r}")
        last_kind = kind
    if not hunks:
        raise CatalogueError(f"mutant {label}: patch has no hunks")
    edits = []
    for old_lines, new_lines in hunks:
        old, new = "".join(old_lines), "".join(new_lines)
        if not old:
            raise CatalogueError(
                f"mutant {label}: a patch hunk without context or removals cannot be located"
            )
        edits.append(Edit(old=old, new=new))
    return tuple(edits)
