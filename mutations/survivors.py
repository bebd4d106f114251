"""Recorded survivors: the one reviewed file (mutations/survivors.toml) that lets a surviving mutant pass.

A survivor passes the PR-scoped gate only with an entry keyed by its mutmut name, whose reason is
"equivalent" (no test can tell it from the original) or "gpu-only" (only a GPU host runs the code), whose
note says why, and whose digest matches the mutation that ran: mutmut renumbers a function's mutants when
the function changes, and a stale entry must not excuse a different mutation. An entry whose mutant is
now killed is stale too, and fails the gate until it is deleted.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from mutations.gate import GateError

REASONS = ("equivalent", "gpu-only")


@dataclass(frozen=True)
class RecordedSurvivor:
    name: str
    reason: str
    digest: str
    note: str


def load_survivors(path: Path) -> dict[str, RecordedSurvivor]:
    if not path.is_file():
        return {}
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8")).get("survivor", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise GateError(f"cannot read recorded survivors {path}: {exc}") from exc
    survivors = {}
    for name, entry in table.items():
        reason, digest, note = (entry.get(k) if isinstance(entry, dict) else None for k in ("reason", "digest", "note"))
        if reason not in REASONS:
            raise GateError(f"{path}: {name}: reason must be one of {', '.join(REASONS)}, got {reason!r}")
        if not isinstance(digest, str) or not digest or not isinstance(note, str) or not note.strip():
            raise GateError(f"{path}: {name}: a survivor needs its digest and a note that says why")
        survivors[name] = RecordedSurvivor(name, reason, digest, note)
    return survivors
