"""Shards of the full mutmut run, balanced by the last run's per-mutant durations (mutations/durations.json).

Longest first onto the least-loaded shard (ties: the lower index), over the mutants that mutmut's own
generator lists for the configured scope; a mutant with no recorded duration weighs the median. The
partition is a pure function of the plan and the durations, so every host computes the same shards
without talking to the others, and `mutations merge` checks that their records cover the plan exactly.
"""

from __future__ import annotations

import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from mutations.diffscope import MutmutScope
from mutations.gate import GateError
from mutations.plan import PlannedMutant, plan_file
from mutations.records import MutantRecord

DURATIONS = Path("mutations") / "durations.json"


def parse_shard(text: str) -> tuple[int, int]:
    """`i/n`, 1-based: `2/4` is the second of four."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError as exc:
        raise GateError(f"--shard must be i/n with integers, got {text!r}") from exc
    if not 1 <= index <= count:
        raise GateError(f"--shard {text}: i must lie in 1..n")
    return index, count


def plan_scope(root: Path, scope: MutmutScope) -> list[PlannedMutant]:
    """Every mutant of the configured scope, as mutmut 3.8 will name them."""
    paths = []
    for source in scope.source_paths:
        for file in sorted((root / source).rglob("*.py")):
            relative = file.relative_to(root).as_posix()
            if scope.contains(relative):
                paths.append(relative)
    # libcst over the whole scope takes minutes of CPU: one file per process, on every core there is.
    with ProcessPoolExecutor() as pool:
        per_file = pool.map(plan_file, [root] * len(paths), paths)
        return sorted(m for mutants in per_file for m in mutants)


def load_durations(path: Path) -> dict[str, float]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {str(name): float(seconds) for name, seconds in data.items()}
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise GateError(f"cannot read per-mutant durations {path}: {exc}") from exc


def write_durations(records: list[MutantRecord], path: Path) -> None:
    path.write_text(json.dumps({r.name: r.duration_s for r in sorted(records)}, indent=0, ensure_ascii=False) + "\n")


def partition(names: list[str], durations: dict[str, float], count: int) -> list[list[str]]:
    """`count` shards of `names`, longest first onto the least-loaded shard."""
    known = [durations[n] for n in names if n in durations]
    default = statistics.median(known) if known else 1.0
    weight = {n: durations.get(n, default) for n in names}
    shards: list[list[str]] = [[] for _ in range(count)]
    loads = [0.0] * count
    for name in sorted(names, key=lambda n: (-weight[n], n)):
        lightest = min(range(count), key=lambda i: (loads[i], i))
        shards[lightest].append(name)
        loads[lightest] += weight[name]
    return [sorted(shard) for shard in shards]


def shard_plan(root: Path, scope: MutmutScope, count: int) -> list[list[PlannedMutant]]:
    """The mutants of each of `count` shards, in shard order."""
    planned = plan_scope(root, scope)
    shards = partition([m.name for m in planned], load_durations(root / DURATIONS), count)
    return [[m for m in planned if m.name in set(names)] for names in shards]


def coverage_failures(plan: list[PlannedMutant], records: list[MutantRecord]) -> list[str]:
    """A merged run must hold a record for every planned mutant and for nothing else."""
    planned = {m.name for m in plan}
    seen = {r.name for r in records}
    failures = []
    if planned - seen:
        failures.append(f"{len(planned - seen)} planned mutants have no record (a shard dropped them), e.g. {min(planned - seen)}")
    if seen - planned:
        failures.append(f"{len(seen - planned)} records are for mutants outside the plan (another tree?), e.g. {min(seen - planned)}")
    return failures
