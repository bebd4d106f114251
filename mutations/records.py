"""Raw per-mutant records: what a mutmut run decided for each mutant and how long it took.

Shards and the PR-scoped gate exchange these, never scores: a score is computed once, from the union of
the records, so any partition of the mutants gives the same report. Statuses are mutmut 3.8's words
(`mutmut.stats.status_by_exit_code`); "not checked" is a mutant with no verdict in its `.meta`.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from mutmut.stats import status_by_exit_code

from mutations.gate import GateError, MutmutStats

KILLED = "killed"


@dataclass(frozen=True, order=True)
class MutantRecord:
    name: str  # mutmut's mutant name, e.g. refengine.core.scheduler.xǁSchedulerǁschedule__mutmut_12
    path: str  # repo-relative source file
    status: str
    duration_s: float
    tree: str  # mutations.tree.tree_digest of the checkout that decided it


def read_meta(mutants: Path, path: str, tree: str, names: set[str] | None = None) -> list[MutantRecord]:
    """The records of one source file from mutmut's `mutants/<path>.meta` (all, or those in `names`), decided
    on the tree whose digest is `tree`."""
    meta_path = mutants / f"{path}.meta"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        exit_codes = meta["exit_code_by_key"]
        durations = meta.get("durations_by_key", {})
    except (OSError, ValueError, KeyError) as exc:
        raise GateError(f"cannot read mutmut's results {meta_path}: {exc}") from exc
    return [
        MutantRecord(name, path, status_by_exit_code[code], round(float(durations.get(name, 0.0)), 3), tree)
        for name, code in exit_codes.items()
        if names is None or name in names
    ]


def read_all(mutants: Path, tree: str) -> list[MutantRecord]:
    """Every record of a `mutants/` directory, file by file."""
    metas = sorted(mutants.rglob("*.py.meta"))
    return [r for meta in metas for r in read_meta(mutants, meta.relative_to(mutants).as_posix().removesuffix(".meta"), tree)]


def write_records(records: list[MutantRecord], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(asdict(r), ensure_ascii=False, sort_keys=True) for r in sorted(records)]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def load_records(path: Path) -> list[MutantRecord]:
    try:
        return [MutantRecord(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line]
    except (OSError, ValueError, TypeError) as exc:
        raise GateError(f"cannot read mutant records {path}: {exc}") from exc


def merge(parts: list[list[MutantRecord]]) -> list[MutantRecord]:
    """The union of disjoint record sets of one tree. A mutant in two parts means the partition is broken, and
    parts of two trees are verdicts on different code: both refused."""
    trees = sorted({record.tree for part in parts for record in part})
    # Invariant: a merged run is one tree's verdicts (records of another checkout are not this code's).
    if len(trees) > 1:
        raise GateError(f"the records come from {len(trees)} trees ({', '.join(trees)}): rerun the shards on one checkout")
    seen: dict[str, MutantRecord] = {}
    for part in parts:
        for record in part:
            if record.name in seen:
                raise GateError(f"{record.name} is in two shards: a partition must hold each mutant once")
            seen[record.name] = record
    return sorted(seen.values())


def stats_of(records: list[MutantRecord]) -> MutmutStats:
    """The gate's buckets over raw records, so a merged run is scored exactly as one run would be."""
    counts = Counter(r.status for r in records)
    return MutmutStats(
        killed=counts[KILLED],
        survived=counts["survived"],
        total=len(records),
        no_tests=counts["no tests"],
        skipped=counts["skipped"],
        suspicious=counts["suspicious"],
        timeout=counts["timeout"],
        check_was_interrupted_by_user=counts["check was interrupted by user"],
        segfault=counts["segfault"],
    )
