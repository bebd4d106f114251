"""CUDA graphs of a drafter's fixed-shape proposal: one graph per padded batch size, like the target's
decode and verify steps (worker/cuda_graphs.py).

A head's proposal after its eager pass over the committed rows is a function of one row per request
(ProposalInputs) with shapes fixed by the batch size alone: EAGLE/EAGLE3/MTP's passes 2..k and
DFlash's query block. The proposer writes it with tensor ops only (its attention metadata comes from
attention_metadata_builder.uniform_query_metadata), so the same function runs eagerly or is captured
here. Replay copies the requests' integers into static buffers (one host-to-device copy from a pinned
staging buffer) and their hidden rows device to device, then runs the smallest captured batch of at
least their number. Padded rows want 0 drafts: they write no KV (slot -1) and attend over nothing
(seq_len 0), and their rows are cut off before anyone sees them.

Capture needs attention that never reads device values on the host, i.e. the Triton backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from refengine.spec_decode.network_proposer import to_device


class DraftGraphError(RuntimeError):
    """A replay was asked for a proposal no captured graph fits."""


@dataclass(frozen=True, slots=True)
class ProposalInputs:
    """One row per proposing request, on the host (the integers) or on the device (all of them)."""

    tokens: torch.Tensor  # [B] int64: the last sampled token (DFlash feeds it; EAGLE's pass 1 already did)
    starts: torch.Tensor  # [B] int64: the position of the first row the proposal feeds
    num_drafts: torch.Tensor  # [B] int64: drafts the request wants (<= k; 0: a padded row)
    block_tables: torch.Tensor  # [B, W] int64: the request's blocks, any value past them
    hidden: torch.Tensor | None  # [B, H] on the device: EAGLE's pass-1 output rows; None for DFlash

    @property
    def num_seqs(self) -> int:
        return self.starts.shape[0]

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

    def _fill(self, padded: int, inputs: ProposalInputs | None = None) -> None:
        """Stage the requests (or, without any, pure padding) and copy them to the static buffers."""
        self._copied.synchronize()  # the previous copy has left the staging buffer
        self._staging.zero_()  # padding: token 0 at position 0, no drafts, block 0
        staged = self._views(self._staging, padded)
        n = 0 if inputs is None else inputs.num_seqs
        if inputs is not None:
            staged.tokens[:n] = inputs.tokens
            staged.starts[:n] = inputs.starts
            staged.num_drafts[:n] = inputs.num_drafts
            staged.block_tables[:n, : inputs.block_tables.shape[1]] = inputs.block_tables
        self._static.copy_(self._staging, non_blocking=True)
        self._copied.record()
        if self._hidden is not None:
            if inputs is not None:
                self._hidden[:n].copy_(inputs.hidden)
            self._hidden[n:padded].zero_()

    # ---- capture -------------------------------------------------------------------------------
    def capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            for padded in reversed(self.batch_sizes):
                self._fill(padded)
                inputs = self._views(self._static, padded)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):  # compile kernels, create handles
                        self.draft(inputs)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    drafts = self.draft(inputs)
                self._graphs[padded] = _Graph(graph, drafts)
        torch.cuda.synchronize()

    # ---- replay --------------------------------------------------------------------------------
    def padded_size(self, num_seqs: int) -> int | None:
        return next((b for b in self.batch_sizes if b >= num_seqs and b in self._graphs), None)

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
