"""The per-file ratchet: each file's strict score may not fall below the score recorded in mutations/scores.toml.

The table is written by a full run that passed (`mutations merge --write-scores`), so a recorded score only
rises. A file with no entry is new and must reach the global threshold (mutations/threshold.toml). Scores
are computed from raw per-mutant records with the gate's formula, killed / (all but skipped).
"""

from __future__ import annotations

import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from mutations.gate import GateError
from mutations.records import MutantRecord, stats_of


@dataclass(frozen=True)
class FileScore:
    path: str
    killed: int
    scored: int

    @property
    def score(self) -> float:
        return self.killed / self.scored if self.scored else 0.0


def file_scores(records: list[MutantRecord]) -> dict[str, FileScore]:
    by_path: dict[str, list[MutantRecord]] = defaultdict(list)
    for record in records:
        by_path[record.path].append(record)
    scores = {}
    for path, rows in sorted(by_path.items()):
        stats = stats_of(rows)
        scores[path] = FileScore(path, stats.killed, stats.scored)
    return scores


def load_scores(path: Path) -> dict[str, float]:
    if not path.is_file():
        return {}
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
        return {name: float(entry["score"]) for name, entry in table.get("file", {}).items()}
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise GateError(f"cannot read the per-file scores {path}: {exc}") from exc


def check(scores: dict[str, FileScore], recorded: dict[str, float], min_score: float) -> list[str]:
    """One failure per file whose score fell below its recorded score, or, new, below the threshold."""
    failures = []
    for path, now in scores.items():
        floor = recorded.get(path)
        if floor is None and now.score < min_score:
            failures.append(f"{path}: new file scores {now.score:.4f}, below the threshold {min_score:.4f}")
        elif floor is not None and now.score < floor:
            failures.append(f"{path}: score {now.score:.4f} fell below its recorded {floor:.4f}")
    return failures


def render_scores(scores: dict[str, FileScore], commit: str) -> str:
    lines = [
        "# Per-file mutmut scores, killed / (all but skipped), written by `mutations merge --write-scores` after a",
        f"# full run that passed (tree {commit}). The gate fails when a file falls below its score here; a file",
        "# with no entry must reach min_score in threshold.toml. Never edit a score down by hand.",
    ]
    for path, s in scores.items():
        lines += ["", f'[file."{path}"]', f"killed = {s.killed}", f"scored = {s.scored}", f"score = {s.score:.4f}"]
    return "\n".join(lines) + "\n"
