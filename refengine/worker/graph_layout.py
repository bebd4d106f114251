"""Where a step's inputs sit in a CUDA graph's static buffers (worker/cuda_graphs.py), as pure tensor
writes, so that a CPU test checks the padding that only a GPU replays.

A graph is captured for a token count T and holds any step of at most T tokens and `max_seqs`
sequences: decode rows, verify blocks and prefill chunks alike, since the attention kernels find each
token's sequence from `query_start_loc`. The step's tokens and sequences come first, exactly as the
host built them, so that what the device fills in afterwards (device_inputs.py) finds its rows where
it expects them. Behind them:

    tokens t..T-1        one padding sequence (index num_seqs) of seq_len 0 and slot -1: no KV write,
                         no keys, zero attention output; they read no id from the device and move by 0
    sequences past it    empty (their query starts at T), seq_len 0, no shift
    logits rows          the step's sampled rows first, then row 0 again; cut off after the replay

One int64 buffer holds every field, the device completion's indices (device_inputs.py) too, so a step
travels in one host-to-device copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.worker.device_inputs import DeviceInputIndices, DeviceInputs
from refengine.worker.errors import RunnerInvariantError


@dataclass(frozen=True, slots=True)
class GraphViews:
    ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T]
    query_start_loc: torch.Tensor  # [max_seqs + 2]: the step's, the padding sequence's end, the empty ones
    seq_lens: torch.Tensor  # [max_seqs + 1]
    block_tables: torch.Tensor  # [max_seqs + 1, width]
    logits_indices: torch.Tensor  # [num_logits(T)]: the rows whose logits the graph computes
    take: torch.Tensor  # [T]: DeviceInputIndices' fields
    seq_of_token: torch.Tensor  # [T]
    seq_source: torch.Tensor  # [max_seqs + 1]
    seq_shift: torch.Tensor  # [max_seqs + 1]

    def metadata(self) -> AttentionMetadata:
        return AttentionMetadata(self.query_start_loc, self.seq_lens, self.block_tables, self.slots, causal=True)

    def device_inputs(self, source: torch.Tensor, rejected: torch.Tensor) -> DeviceInputs:
        """The step's completion from its staged indices and the latest frame's values in `source` and
        `rejected` (whose last entry is the 0 that sequences without a frame row read)."""
        return DeviceInputs(self.take, self.seq_source, self.seq_shift, self.seq_of_token, source, rejected)


@dataclass(frozen=True, slots=True)
class GraphLayout:
    max_tokens: int  # the largest captured T
    max_seqs: int
    max_logits: int  # sampled rows a step can have: max_seqs * (k + 1)
    width: int  # block-table columns

    def num_logits(self, num_tokens: int) -> int:
        return min(num_tokens, self.max_logits)

    @property
    def size(self) -> int:
        b = self.max_seqs + 1
        return 5 * self.max_tokens + (b + 1) + b + self.max_logits + b * self.width + 2 * b

    def views(self, buffer: torch.Tensor, num_tokens: int) -> GraphViews:
        # Also called on the numpy view of a host buffer (stage): the slicing is the same.
        t, b = self.max_tokens, self.max_seqs + 1
        starts = 3 * t
        lens = starts + b + 1
        logits = lens + b
        tables = logits + self.max_logits
        take = tables + b * self.width
        sources = take + 2 * t
        return GraphViews(
            ids=buffer[:num_tokens],
            positions=buffer[t : t + num_tokens],
            slots=buffer[2 * t : 2 * t + num_tokens],
            query_start_loc=buffer[starts:lens],
            seq_lens=buffer[lens:logits],
            block_tables=buffer[tables : tables + b * self.width].reshape(b, self.width),
            logits_indices=buffer[logits : logits + self.num_logits(num_tokens)],
            take=buffer[take : take + num_tokens],
            seq_of_token=buffer[take + t : take + t + num_tokens],
            seq_source=buffer[sources : sources + b],
            seq_shift=buffer[sources + b : sources + 2 * b],
        )

    def stage(
        self,
        buffer: torch.Tensor,
        num_tokens: int,
        ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        meta: AttentionMetadata | None = None,
        logits_indices: torch.Tensor | None = None,
        indices: DeviceInputIndices | None = None,
    ) -> None:
        """Write a step (or, without one, pure padding) into host `buffer` for a T = `num_tokens` graph;
        `views` reads it back. A step comes with its device completion's `indices`. The writes go through numpy: a step stages every field, and a numpy
        slice assignment costs the host a fraction of a torch op's dispatch."""
        v = self.views(buffer.numpy(), num_tokens)
        n = 0 if meta is None else meta.seq_lens.shape[0]
        t = 0 if meta is None else meta.slot_mapping.shape[0]
        s = 0 if logits_indices is None else logits_indices.shape[0]
        if meta is not None:
            # A step replays only a graph that holds all its tokens, sequences, sampled rows and blocks
            # (CudaGraphs.can_run); anything else would be cut off silently.
            if t > num_tokens or n > self.max_seqs or s > v.logits_indices.shape[0] or meta.block_tables.shape[1] > self.width:
                raise RunnerInvariantError(
                    f"a step of {t} tokens, {n} sequences and {s} sampled rows does not fit a graph of {num_tokens} tokens"
                )
            v.ids[:t] = ids.numpy()
            v.positions[:t] = positions.numpy()
            v.slots[:t] = meta.slot_mapping.numpy()
            v.query_start_loc[: n + 1] = meta.query_start_loc.numpy()
            v.seq_lens[:n] = meta.seq_lens.numpy()
            width = meta.block_tables.shape[1]
            v.block_tables[:n, :width] = meta.block_tables.numpy()
            v.block_tables[:n, width:] = 0
            if logits_indices is not None:
                v.logits_indices[:s] = logits_indices.numpy()
            v.take[:t] = indices.take
            v.seq_of_token[:t] = indices.seq_of_token
            v.seq_source[:n] = indices.seq_source
            v.seq_shift[:n] = indices.seq_shift
        v.ids[t:] = 0
        v.positions[t:] = 0
        v.slots[t:] = -1  # padding writes no KV
        v.query_start_loc[n + 1 :] = num_tokens  # the padding sequence ends at T; the rest are empty
        if meta is None:
            v.query_start_loc[0] = 0
        v.seq_lens[n:] = 0  # and attends over nothing
        v.block_tables[n:] = 0
        v.logits_indices[s:] = 0
        v.take[t:] = -1
        v.seq_of_token[t:] = n  # the padding sequence's rows: they move by its shift, 0
        v.seq_source[n:] = -1
        v.seq_shift[n:] = 0
