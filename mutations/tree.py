"""What a mutmut verdict depends on, as one digest: the files mutmut copies and the configuration it runs under.

A record is a verdict on one tree. Shards run on several hosts or on several days, so each record carries the
digest of the tree that decided it, and `mutations merge` takes records only from the checkout it scores.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path

# What a scratch copy leaves out (shutil.ignore_patterns there), and so what the digest leaves out.
IGNORED = ("__pycache__", "*.pyc")


def mutmut_sections(root: Path) -> dict[str, dict]:
    """pyproject's [tool.mutmut] and [tool.pytest.ini_options]: what a scratch copy runs under."""
    tool = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    return {"tool.mutmut": dict(tool["mutmut"]), "tool.pytest.ini_options": tool.get("pytest", {}).get("ini_options", {})}


def copied_entries(config: dict) -> list[str]:
    """The paths mutmut copies into its `mutants/` tree: the sources, tests/ and `also_copy`."""
    return sorted({*config.get("source_paths", []), "tests", *config.get("also_copy", [])})


def _ignored(relative: Path) -> bool:
    return any(fnmatch.fnmatch(part, pattern) for part in relative.parts for pattern in IGNORED)


def _files(root: Path, entries: list[str]) -> Iterator[Path]:
    for entry in entries:
        source = root / entry
        if source.is_file():
            yield source
        elif source.is_dir():
            yield from sorted(p for p in source.rglob("*") if p.is_file() and not _ignored(p.relative_to(root)))


def tree_digest(root: Path) -> str:
    """sha256 over the configuration and every copied file's path and bytes; 16 hex digits."""
    sections = mutmut_sections(root)
    digest = hashlib.sha256(json.dumps(sections, sort_keys=True).encode())
    for path in _files(root, copied_entries(sections["tool.mutmut"])):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
