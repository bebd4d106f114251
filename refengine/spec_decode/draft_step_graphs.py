"""CUDA graphs of a drafter's whole step after a uniform verify step: pass 1 over every fed row (k + 1
per request, EAGLE's head pass or DFlash's context) and the proposal after it, one graph per padded
batch size, like the target's verify graphs (worker/cuda_graphs.py). With them no host work stands
between verify and the next drafts: the step's device tensors (input ids, exact positions, slots,
sequence lengths, block tables, the target's hidden rows, the rejected counts) are copied device to
device into static buffers, and the graph replays.

Padded sequences feed k + 1 rows that write no KV (slot -1), attend over nothing (seq_len 0) and want no
drafts (their block limit is 0), so the proposal's passes write none either; their rows are cut off.
The buffers are filled and the step run by the same code with or without capture (`fill`, `step`), so a
CPU test checks them against the eager proposal; capture and replay run only on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.cuda_graph_sizes import padded_batch_size
from refengine.model.graph_capture import graph_capture
from refengine.spec_decode.proposer import DraftInput, PaddedDraftBatch

if TYPE_CHECKING:
    from refengine.spec_decode.fixed_shape_proposer import FixedShapeProposer


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    drafts: torch.Tensor


class DraftStepGraphs:
    def __init__(
        self,
        proposer: FixedShapeProposer,
        target_hidden: tuple[int, torch.dtype],
        max_blocks_per_seq: int,
        batch_sizes: list[int],
        device: torch.device,
    ) -> None:
        """`target_hidden`: (size, dtype) of the target's hidden rows the step reads."""
        self.proposer = proposer
        self.q = proposer.k + 1  # rows a request feeds in a verify step: its last token and k drafts
        self.batch_sizes = sorted(set(batch_sizes))
        self.max_batch = self.batch_sizes[-1]
        self.width = max_blocks_per_seq
        self.device = device
        tokens, b, q = self.max_batch * self.q, self.max_batch, self.q
        self._ids, self._positions, self._slots = (torch.zeros(tokens, dtype=torch.int64, device=device) for _ in range(3))
        self._seq_lens, self._num_rejected, self._limit = (torch.zeros(b, dtype=torch.int64, device=device) for _ in range(3))
        self._block_tables = torch.zeros(b, self.width, dtype=torch.int64, device=device)
        self._query_start_loc = torch.arange(b + 1, device=device) * q
        self._last_fed_row = torch.arange(b, device=device) * q + q - 1
        self._sequence = torch.arange(b, device=device)
        size, dtype = target_hidden
        self._hidden = torch.zeros(tokens, size, dtype=dtype, device=device)
        self._aux = {i: torch.zeros(tokens, size, dtype=dtype, device=device) for i in proposer.capture_layers}
        self._graphs: dict[int, _Graph] = {}
        self.num_replays = 0

    def padded_size(self, num_seqs: int) -> int | None:
        """The batch size a step of `num_seqs` requests pads to (captured or to be captured)."""
        return padded_batch_size(num_seqs, self.batch_sizes)

    def can_run(self, batch: PaddedDraftBatch) -> bool:
        """A verify step every request of which proposes from k + 1 fed rows, within a captured size."""
        requests = batch.requests
        return (
            bool(requests)
            and all(d.propose and d.num_valid_rows == self.q for d in requests)
            and batch.attn_metadata.block_tables.shape[1] <= self.width
            and self.padded_size(len(requests)) in self._graphs
        )

    def requests(self, padded: int) -> tuple[DraftInput, ...]:
        """`padded` requests of k + 1 fed rows each, all proposing: a batch the graph's step reads only the
        count of (its tensors hold the rest)."""
        return tuple(DraftInput("", (), 0, self.q, slice(i * self.q, (i + 1) * self.q), (), True) for i in range(padded))

    # ---- the step, with or without capture ------------------------------------------------------
    def fill(self, batch: PaddedDraftBatch, limit: torch.Tensor, padded: int) -> None:
        """Copy the step's device tensors into the static buffers, device to device, and make every row
        past them up to `padded` padding (whatever an earlier, larger step left there)."""
        num_seqs = len(batch.requests)
        num_tokens = num_seqs * self.q
        meta = batch.attn_metadata
        width = meta.block_tables.shape[1]
        per_token = (  # (static buffer, the step's rows, what a padding row holds)
            (self._ids, batch.input_ids, 0),
            (self._positions, batch.positions[:num_tokens], 0),
            (self._slots, meta.slot_mapping[:num_tokens], -1),  # padding writes no KV ...
            (self._hidden, batch.hidden_states[:num_tokens], 0),
            *((self._aux[i], batch.aux_hidden_states[i][:num_tokens], 0) for i in self._aux),
        )
        per_seq = (
            (self._seq_lens, meta.seq_lens[:num_seqs]),
            (self._num_rejected, batch.num_rejected_tokens),
            (self._limit, limit),
        )
        for static, value, _ in per_token:
            static[:num_tokens].copy_(value)
        for static, value in per_seq:
            static[:num_seqs].copy_(value)
        self._block_tables[:num_seqs, :width].copy_(meta.block_tables[:num_seqs])
        self._block_tables[:num_seqs, width:].zero_()
        # Padding rows only when the step has fewer requests than its graph: each op costs host time even on
        # an empty slice, and a full step (every step at c = 1) has none. (`>=` would pad an empty slice.)
        if padded > num_seqs:  # pragma: no mutate
            for static, _, pad in per_token:
                static[num_tokens : padded * self.q].fill_(pad)
            for static, _ in per_seq:
                static[num_seqs:padded].zero_()  # ... attends over nothing and wants no drafts
            self._block_tables[num_seqs:padded].zero_()

    def step(self, padded: int) -> torch.Tensor:
        """[padded, k] drafts from the static buffers: pass 1, then the proposal, tensor ops only."""
        proposer = self.proposer
        num_tokens = padded * self.q
        meta = AttentionMetadata(
            self._query_start_loc[: padded + 1],
            self._seq_lens[:padded],
            self._block_tables[:padded],
            self._slots[:num_tokens],
            causal=True,
        )
        batch = PaddedDraftBatch(
            self.requests(padded),
            self._ids[:num_tokens],
            self._num_rejected[:padded],
            self._hidden[:num_tokens],
            {i: t[:num_tokens] for i, t in self._aux.items()},
            self._positions[:num_tokens],
            meta,
        )
        out = proposer.ingest(batch, batch.positions, meta)
        return proposer.drafts_from(
            batch, out, self._sequence[:padded], self._last_fed_row[:padded], self._limit[:padded], proposer.draft
        )

    # ---- capture and replay: a GPU only ---------------------------------------------------------
    def capture(self) -> None:
        with graph_capture(self.device) as capture:
            for padded in reversed(self.batch_sizes):
                self._slots[: padded * self.q].fill_(-1)  # all padding while capturing: no KV is written
                self._seq_lens.zero_()
                self._limit.zero_()
                self._graphs[padded] = _Graph(*capture(partial(self.step, padded)))

    def run(self, batch: PaddedDraftBatch, limit: torch.Tensor) -> torch.Tensor:
        """[B, k] drafts of a step that can_run() accepted: a view of the graph's static output, valid
        until the next replay."""
        num_seqs = len(batch.requests)
        padded = self.padded_size(num_seqs)
        self.fill(batch, limit, padded)
        captured = self._graphs[padded]
        captured.graph.replay()
        self.num_replays += 1
        return captured.drafts[:num_seqs]
