"""What the device fills in of a step's host-built inputs (vLLM's _maybe_adjust_inputs_on_gpu).

The host builds ids, positions and attention metadata from its counts, which under async scheduling
assume every draft in flight was accepted. The latest step's results never visit the host on the way:
its last valid token and its drafts are gathered into the input ids, and each sequence's positions,
sequence length and slots move back by its rejected drafts (read on the device), so the step runs at
the exact positions. The completion has fixed shapes, so the target's CUDA graph captures it with the
forward (worker/target_graphs.py); the eager path runs the same code.

Invariant numbers refer to docs/invariants.md.
"""

from dataclasses import dataclass

import numpy as np
import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.device import arrays_to_device
from refengine.worker.step_frame import StepFrame


@dataclass(frozen=True, slots=True)
class DeviceInputIndices:
    """The host's side of the completion: which rows and sequences read the latest frame."""

    take: np.ndarray  # [T] per fed row: the entry of the latest frame's `source` its id is; -1: the host's id
    seq_source: np.ndarray  # [S] per sequence: its row of the latest frame's rejected counts; -1: none
    seq_shift: np.ndarray  # [S] per sequence: the scheduler's count less the runner's
    seq_of_token: np.ndarray  # [T] each fed row's sequence
    gathers: bool  # some row's id is read from the device
    shifts: bool  # some sequence may move back: the host's positions are not known to be exact

    @classmethod
    def build(
        cls, at: list[int], take: list[int], sources: list[int], host_shift: list[int], seq_of_token: np.ndarray
    ) -> "DeviceInputIndices":
        """Flat rows `at` take entries `take` of the latest frame's source; sequence i moves back by its
        host over-count `host_shift[i]` plus the rejected drafts of row `sources[i]` of the frame (-1: none)."""
        take_a = np.full(seq_of_token.shape[0], -1, dtype=np.int64)
        take_a[at] = take
        return cls(
            take_a,
            np.asarray(sources, dtype=np.int64),
            np.asarray(host_shift, dtype=np.int64),
            seq_of_token.astype(np.int64, copy=False),
            gathers=bool(at),
            shifts=any(host_shift) or any(s >= 0 for s in sources),
        )

    def to_device(self, latest: StepFrame | None, device: torch.device) -> "DeviceInputs":
        """The eager path's inputs: the indices in one host-to-device copy, beside the frame's values."""
        take, seq_source, seq_shift, seq_of_token = arrays_to_device(
            [self.take, self.seq_source, self.seq_shift, self.seq_of_token], device
        )
        if latest is None:
            source, rejected = take[:0], seq_shift.new_zeros(1)
        else:
            source = latest.source
            rejected = torch.cat([latest.num_rejected, latest.num_rejected.new_zeros(1)])
        return DeviceInputs(take, seq_source, seq_shift, seq_of_token, source, rejected)


@dataclass(frozen=True, slots=True)
class DeviceInputs:
    """The completion's inputs on the device: the indices (DeviceInputIndices') and the latest frame's
    values they read. A CUDA graph's are views of its static buffers."""

    take: torch.Tensor
    seq_source: torch.Tensor
    seq_shift: torch.Tensor
    seq_of_token: torch.Tensor
    source: torch.Tensor  # the latest frame's source ids
    rejected: torch.Tensor  # the latest frame's rejected drafts per row, then a 0: what a -1 index reads

    def complete(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        block_size: int,
        *,
        gathers: bool = True,
        shifts: bool = True,
    ) -> "CompletedInputs":
        """The step's inputs completed, over every row of the buffers (padding rows read nothing and move
        by 0), as new tensors: the host's stay as staged, so a graph's replay is the same step every time.
        A graph captures both parts; the eager path skips what the step does not need."""
        gathered = None
        if gathers:
            gathered = self.source[self.take.clamp(min=0)]
            ids = torch.where(self.take >= 0, gathered.clamp(min=0), ids)
        if shifts:
            # Invariant 48: the exact count is the optimistic one less the rejected drafts.
            shift = self.seq_shift + self.rejected[self.seq_source]
            positions = positions - shift[self.seq_of_token]
            slots = meta.block_tables[self.seq_of_token, positions // block_size] * block_size + positions % block_size
            meta = AttentionMetadata(
                meta.query_start_loc,
                meta.seq_lens - shift,
                meta.block_tables,
                # A padding row keeps its -1: it writes no KV.
                torch.where(meta.slot_mapping < 0, meta.slot_mapping, slots),
                causal=meta.causal,
            )
        return CompletedInputs(ids, positions, meta, gathered)


@dataclass(frozen=True, slots=True)
class CompletedInputs:
    """A step's inputs at the exact positions, and each row's id as gathered from the latest frame (-1
    where the drafter proposed none, which the input feeds as 0; None when no row gathers)."""

    ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    gathered: torch.Tensor | None
