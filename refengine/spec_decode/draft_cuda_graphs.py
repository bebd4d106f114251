"""CUDA graphs of a drafter's fixed-shape proposal: one graph per padded batch size, like the target's
decode and verify steps (worker/cuda_graphs.py).

A head's proposal after its eager pass over the committed rows is a function of one row per request
(ProposalInputs) with shapes fixed by the batch size alone: EAGLE/EAGLE3/MTP's passes 2..k and
DFlash's query block. The proposer writes it with tensor ops only (its attention metadata comes from
attention_metadata_builder.uniform_query_metadata), so the same function runs eagerly or is captured
here. Replay copies the requests' integers into static buffers (one host-to-device copy from a pinned
staging buffer) and their hidden rows device to device, then runs the smallest captured batch of at
least their number, chosen afresh per replay (model/cuda_graph_sizes.py). Padded rows want 0 drafts: they write no KV (slot -1) and attend over nothing
(seq_len 0), and their rows are cut off before anyone sees them.

Capture needs attention that never reads device values on the host, i.e. the Triton backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from refengine.model.cuda_graph_sizes import padded_batch_size
from refengine.model.device import to_device
from refengine.model.graph_capture import graph_capture


class DraftGraphError(RuntimeError):
    """A replay was asked for a proposal no captured graph fits."""


@dataclass(frozen=True, slots=True)
class ProposalInputs:
    """One row per proposing request; each integer tensor on the host or (computed there) on the device,
    the hidden rows on the device."""

    tokens: torch.Tensor  # [B] int64: the last sampled token (DFlash feeds it; EAGLE's pass 1 already did)
    starts: torch.Tensor  # [B] int64: the position of the first row the proposal feeds
    num_drafts: torch.Tensor  # [B] int64: drafts the request wants (<= k; 0: a padded row)
    block_tables: torch.Tensor  # [B, W] int64: the request's blocks, any value past them
    hidden: torch.Tensor | None  # [B, H] on the device: EAGLE's pass-1 output rows; None for DFlash

    @property
    def num_seqs(self) -> int:
        return self.starts.shape[0]

    def padded(self, num_seqs: int, width: int) -> ProposalInputs:
        """These rows followed by padding up to `num_seqs` rows, the block tables widened to `width`.
        A padded row wants no drafts (token 0 at position 0, block 0, a zero hidden row), so it writes
        no KV and attends over nothing."""
        extra = num_seqs - self.num_seqs

        def pad(rows: torch.Tensor) -> torch.Tensor:
            return torch.cat([rows, rows.new_zeros(extra, *rows.shape[1:])])

        tables = self.block_tables.new_zeros(num_seqs, width)
        tables[: self.num_seqs, : self.block_tables.shape[1]] = self.block_tables
        return ProposalInputs(
            pad(self.tokens),
            pad(self.starts),
            pad(self.num_drafts),
            tables,
            None if self.hidden is None else pad(self.hidden),
        )

    def to(self, device: torch.device) -> ProposalInputs:
        return ProposalInputs(
            to_device(self.tokens, device),
            to_device(self.starts, device),
            to_device(self.num_drafts, device),
            to_device(self.block_tables, device),
            self.hidden,
        )


Draft = Callable[[ProposalInputs], torch.Tensor]  # device inputs -> [B, k] draft ids on the device


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    drafts: torch.Tensor


class DraftCudaGraphs:
    def __init__(
        self,
        draft: Draft,
        *,
        hidden: tuple[int, torch.dtype] | None,
        max_blocks_per_seq: int,
        batch_sizes: list[int],
        device: torch.device,
    ) -> None:
        """`hidden`: (size, dtype) of the hidden rows the proposal reads, None when it reads none."""
        self.draft = draft
        self.batch_sizes = sorted(set(batch_sizes))
        self.max_batch = self.batch_sizes[-1]
        self.width = max_blocks_per_seq
        self.device = device
        # One int64 buffer: [tokens | starts | num_drafts] x max_batch, [block_tables] x max_batch * width.
        size = self.max_batch * (3 + self.width)
        self._staging = torch.zeros(size, dtype=torch.int64).pin_memory()
        self._static = torch.zeros(size, dtype=torch.int64, device=device)
        self._hidden = None if hidden is None else torch.zeros(self.max_batch, hidden[0], dtype=hidden[1], device=device)
        self._copied = torch.cuda.Event()
        self._graphs: dict[int, _Graph] = {}
        self.num_replays = 0

    def _views(self, buffer: torch.Tensor, batch: int) -> ProposalInputs:
        b = self.max_batch
        hidden = None if self._hidden is None else self._hidden[:batch]
        return ProposalInputs(
            tokens=buffer[:batch],
            starts=buffer[b : b + batch],
            num_drafts=buffer[2 * b : 2 * b + batch],
            block_tables=buffer[3 * b :].view(b, self.width)[:batch],
            hidden=hidden,
        )

    def _fill(self, padded: int, inputs: ProposalInputs) -> None:
        """Stage the requests, padded to `padded` rows, and copy them to the static buffers."""
        full = inputs.padded(padded, self.width)
        self._copied.synchronize()  # the previous copy has left the staging buffer
        staged = self._views(self._staging, padded)
        static = self._views(self._static, padded)
        device_copies = []
        for name in ("tokens", "starts", "num_drafts", "block_tables"):
            value = getattr(full, name)
            if value.device.type == "cpu":
                getattr(staged, name).copy_(value)
            else:
                device_copies.append((getattr(static, name), value))
        self._static.copy_(self._staging, non_blocking=True)
        self._copied.record()
        # Integers the device computed (the padded batch's starts and counts) never visit the host: they
        # overwrite their staged zeros device to device, after the staging copy in stream order.
        for target, value in device_copies:
            target.copy_(value)
        if self._hidden is not None:
            self._hidden[:padded].copy_(full.hidden)

    def _no_requests(self) -> ProposalInputs:
        none = torch.zeros(0, dtype=torch.int64)
        hidden = None if self._hidden is None else self._hidden[:0]
        return ProposalInputs(none, none, none, none.view(0, 0), hidden)

    # ---- capture -------------------------------------------------------------------------------
    def capture(self) -> None:
        with graph_capture(self.device) as capture:
            for padded in reversed(self.batch_sizes):
                self._fill(padded, self._no_requests())
                inputs = self._views(self._static, padded)
                self._graphs[padded] = _Graph(*capture(partial(self.draft, inputs)))

    # ---- replay --------------------------------------------------------------------------------
    def padded_size(self, num_seqs: int) -> int | None:
        return padded_batch_size(num_seqs, self._graphs)

    def can_run(self, inputs: ProposalInputs) -> bool:
        return inputs.block_tables.shape[1] <= self.width and self.padded_size(inputs.num_seqs) is not None

    def run(self, inputs: ProposalInputs) -> torch.Tensor:
        """[B, k] drafts for host integers and device hidden rows: a view of the graph's static output,
        valid until the next replay."""
        padded = self.padded_size(inputs.num_seqs)
        # Invariant: run() is only called for a proposal that can_run() accepted.
        if padded is None:
            raise DraftGraphError(f"no captured drafter graph for {inputs.num_seqs} requests")
        self._fill(padded, inputs)
        captured = self._graphs[padded]
        captured.graph.replay()
        self.num_replays += 1
        return captured.drafts[: inputs.num_seqs]
