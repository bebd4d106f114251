"""GrammarOutput (vLLM's name): a step's token bitmasks, which the manager computes, the scheduler hands
on with its SchedulerOutput and the runner's sampler applies."""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class GrammarOutput:
    """`rows[req_id]` is (first row, number of rows) in `grammar_bitmask`: one row per verified row of
    the request, each draft row then the bonus row."""

    rows: dict[str, tuple[int, int]]
    grammar_bitmask: Any  # numpy int32 [rows, ceil(vocab / 32)]: bit t of a row set = token t allowed
