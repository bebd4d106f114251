"""InputBatch: the persistent batch (vLLM's name). Every request the runner holds owns one row of
preallocated host arrays: its token ids, its KV block ids and its sampling parameters.

The rows change only as the SchedulerOutputs say: a new or resumed request writes its row once, a
finished or preempted one leaves and the last row moves into the hole (rows stay dense), a step appends
the tokens it sampled and the blocks the scheduler added. Building a step is then array arithmetic
over the scheduled rows (input ids, positions, slots, block tables, sampling metadata), with no
per-request work that grows with the context: a request 4,000 tokens into its decode costs what one
4 tokens in does. The counters below make that visible to tests.

Invariant numbers refer to docs/invariants.md.
"""

from collections.abc import Sequence

import numpy as np
import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.attention_metadata_builder import metadata_from_table
from refengine.sample import rng
from refengine.sample.metadata import SamplingMetadata
from refengine.worker.block_table import BlockTable
from refengine.worker.errors import RunnerInvariantError
from refengine.worker.request_state import CachedRequestState


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, max_num_blocks_per_req: int, block_size: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.req_ids: list[str] = []  # row r's request; rows 0 .. num_reqs - 1 are all held
        self.req_id_to_index: dict[str, int] = {}
        # Row r's tokens at their positions, the runner's one copy of its request's history: the known
        # ones, -1 for an id still in flight (the device gather fills it) and, past them, the drafts fed
        # this step.
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        self.block_table = BlockTable(max_num_reqs, max_num_blocks_per_req, block_size)
        self.temperature = np.zeros(max_num_reqs, dtype=np.float32)
        self.top_p = np.ones(max_num_reqs, dtype=np.float32)
        self.top_k = np.zeros(max_num_reqs, dtype=np.int64)
        self.key_words = np.zeros(max_num_reqs, dtype=np.int64)  # rng.key_word of the request's key
        # Work done since start, for tests: token ids written, and rows written whole (added or moved).
        self.num_token_writes = 0
        self.num_row_writes = 0

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    # ---- membership ----------------------------------------------------------------------------
    def add_request(self, state: CachedRequestState, token_ids: Sequence[int]) -> int:
        """Write a new (or resumed) request's row, its `token_ids` (prompt and outputs) included; returns
        the row."""
        # Invariant 17: one row per held request, found by id.
        if state.req_id in self.req_id_to_index:
            raise RunnerInvariantError(f"request {state.req_id!r} is already in the batch")
        if self.num_reqs == self.max_num_reqs:
            raise RunnerInvariantError(f"request {state.req_id!r}: the batch holds its {self.max_num_reqs} rows")
        row = self.num_reqs
        self.req_ids.append(state.req_id)
        self.req_id_to_index[state.req_id] = row
        self.write_tokens(row, 0, token_ids)
        self.block_table.add_row(row, state.block_ids)
        params = state.params
        self.temperature[row] = params.temperature
        self.top_p[row] = params.top_p
        self.top_k[row] = max(params.top_k, 0)
        self.key_words[row] = rng.key_word(params.rng_key)
        self.num_row_writes += 1
        return row

    def remove_request(self, req_id: str) -> None:
        """Drop a request's row (a no-op for one the batch does not hold); the last row fills the hole."""
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return
        last = self.req_ids.pop()
        if last != req_id:
            self._move_row(self.num_reqs, row)
            self.req_ids[row] = last
            self.req_id_to_index[last] = row

    def _move_row(self, src: int, dst: int) -> None:
        self.token_ids[dst] = self.token_ids[src]
        self.block_table.move_row(src, dst)
        for column in (self.temperature, self.top_p, self.top_k, self.key_words):
            column[dst] = column[src]
        self.num_row_writes += 1

    # ---- per step ------------------------------------------------------------------------------
    def history(self, row: int, num_tokens: int) -> np.ndarray:
        """Row `row`'s first `num_tokens` tokens: a view, valid until the row is written or moved."""
        return self.token_ids[row, :num_tokens]

    def write_tokens(self, row: int, start: int, token_ids: Sequence[int]) -> None:
        self.token_ids[row, start : start + len(token_ids)] = token_ids
        self.num_token_writes += len(token_ids)

    def prepare_inputs(
        self, rows: Sequence[int], starts: Sequence[int], num_scheduled: Sequence[int], token_starts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, np.ndarray]:
        """Host input ids, positions, attention metadata and each token's sequence of a step that feeds,
        for each i, num_scheduled[i] positions of row rows[i] from starts[i] (the scheduler's count), in
        this order; the ids are read from the row's own count token_starts[i] on (its drafts already
        written into the row)."""
        rows_a = np.asarray(rows, dtype=np.int64)
        starts_a = np.asarray(starts, dtype=np.int64)
        num_blocks = self.block_table.num_blocks[rows_a]
        meta, positions, seq_of_token = metadata_from_table(
            starts_a,
            np.asarray(num_scheduled, dtype=np.int64),
            self.block_table.table[rows_a, : int(num_blocks.max())],
            num_blocks,
            self.block_table.block_size,
        )
        index = positions - (starts_a - np.asarray(token_starts, dtype=np.int64))[seq_of_token]
        ids = torch.from_numpy(self.token_ids[rows_a[seq_of_token], index])
        return ids, torch.from_numpy(positions), meta, seq_of_token

    def sampling_metadata(
        self,
        rows: Sequence[int],
        positions: Sequence[int],
        masked: Sequence[tuple[int, int]],
        device: torch.device,
        bitmask_rows: Sequence[int] = (),
        token_bitmask: np.ndarray | None = None,
    ) -> SamplingMetadata:
        """Metadata of logits rows that decide `positions[i]` for batch row `rows[i]`; `masked` holds
        the (logits row, token) pairs the constraints forbid, and logits row bitmask_rows[g] is masked by
        the grammar bitmask token_bitmask[g]."""
        rows_a = np.asarray(rows, dtype=np.int64)
        return SamplingMetadata.from_arrays(
            temperature=self.temperature[rows_a],
            top_p=self.top_p[rows_a],
            top_k=self.top_k[rows_a],
            key_words=self.key_words[rows_a],
            positions=np.asarray(positions, dtype=np.int64),
            masked=masked,
            device=device,
            bitmask_rows=bitmask_rows,
            token_bitmask=token_bitmask,
        )
