"""CUDA graphs of the model's steps: forward plus the sampled rows' logits, one graph per token count.

A graph captured for T tokens replays any step of at most T tokens and max_num_seqs sequences: decode
rows, verify blocks of k + 1 rows and prefill chunks alike, mixed as the scheduler mixes them (the
attention kernels find each token's sequence from the metadata). The token counts captured are every
captured batch size times each query length (1, and k + 1 with drafts), so a uniform step pads no more
than it did per batch, and a few larger counts up to MAX_MIXED_TOKENS for the steps that admit a
request: its prefill beside the others' decodes would otherwise run eagerly, a Python launch per
kernel, and stall every running request. Longer steps are compute, not launches, and run eagerly.

A step's inputs are staged into one pinned buffer (graph_layout.py), copied to the static buffers in
one host-to-device copy, and the smallest captured T of at least its tokens is replayed. The graph
completes them first (device_inputs.py, into tensors of its own: the staged inputs stay as they were,
so a replay is the same step every time) from the latest frame's values, which wait in static buffers
of their own: a step in flight costs the host two device copies, not a launch per field. Padding
writes no KV and attends over nothing, and its rows are cut off before anyone sees them.

Capture needs attention that never reads device values on the host, i.e. the Triton backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from refengine.model import attention
from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.cuda_graph_sizes import default_batch_sizes, graph_token_sizes, padded_batch_size
from refengine.model.graph_capture import graph_capture
from refengine.model.kv_cache import KVCache
from refengine.model.transformer import ModelOutput, Transformer
from refengine.worker.device_inputs import CompletedInputs, DeviceInputIndices
from refengine.worker.errors import RunnerInvariantError
from refengine.worker.graph_layout import GraphLayout
from refengine.worker.spec_step_graphs import TargetRows
from refengine.worker.step_frame import StepFrame


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: CompletedInputs  # the step's inputs as the device completed them
    hidden: torch.Tensor
    aux: dict[int, torch.Tensor]
    logits: torch.Tensor


@dataclass(frozen=True, slots=True)
class GraphStep:
    """A replayed step's outputs: views of the graph's static buffers, valid until the next replay."""

    model_output: ModelOutput  # every fed row
    logits: torch.Tensor  # the sampled rows, in order
    positions: torch.Tensor  # every fed row's, after the device's corrections
    attn_metadata: AttentionMetadata  # the step's own sequences
    logits_indices: torch.Tensor  # the sampled rows' indices among the fed rows
    gathered: torch.Tensor  # every fed row's id as read from the latest frame (DeviceInputs.complete)


class CudaGraphs:
    def __init__(
        self,
        model: Transformer,
        kv_cache: KVCache,
        *,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        max_num_batched_tokens: int,
        query_lens: tuple[int, ...] = (1,),
        capture_layers: tuple[int, ...] = (),
        batch_sizes: list[int] | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        self.capture_layers = tuple(capture_layers)
        self.batch_sizes = batch_sizes or default_batch_sizes(max_num_seqs)
        self.token_sizes = graph_token_sizes(self.batch_sizes, query_lens, max_num_batched_tokens)
        self.layout = GraphLayout(
            max_tokens=max(self.token_sizes, default=0),
            max_seqs=max_num_seqs,
            max_logits=max_num_seqs * max(query_lens),
            width=max_blocks_per_seq,
        )
        self._staging = torch.zeros(self.layout.size, dtype=torch.int64).pin_memory()
        self._static = torch.zeros(self.layout.size, dtype=torch.int64, device=self.device)
        # The latest frame's source ids and rejected counts (step_frame.py), read by the completion; the
        # last rejected entry stays 0, what a sequence without a frame row reads.
        self._source = torch.zeros(self.layout.max_logits, dtype=torch.int64, device=self.device)
        self._rejected = torch.zeros(max_num_seqs + 1, dtype=torch.int64, device=self.device)
        self._copied = torch.cuda.Event()
        self._graphs: dict[int, _Graph] = {}
        self.num_replays = 0
        # Replays of steps with rows that sample nothing (a prefill chunk): the mixed path ran.
        self.num_mixed_replays = 0

    def _fill(self, num_tokens: int, ids=None, positions=None, meta: AttentionMetadata | None = None, logits_indices=None, indices=None) -> None:
        """Stage a step (or, without one, pure padding) and copy it to the static buffers."""
        self._copied.synchronize()  # the previous copy has left the staging buffer
        self.layout.stage(self._staging, num_tokens, ids, positions, meta, logits_indices, indices)
        self._static.copy_(self._staging, non_blocking=True)
        self._copied.record()

    def _forward(self, num_tokens: int) -> _Graph:
        v = self.layout.views(self._static, num_tokens)
        done = v.device_inputs(self._source, self._rejected).complete(v.ids, v.positions, v.metadata(), self.kv_cache.block_size)
        out = self.model(done.ids, done.positions, done.attn_metadata, self.kv_cache, capture_layers=self.capture_layers)
        logits = self.model.compute_logits(out.hidden_states[v.logits_indices])
        return _Graph(None, done, out.hidden_states, out.aux_hidden_states, logits)  # type: ignore[arg-type]

    # ---- capture -------------------------------------------------------------------------------
    def capture(self) -> None:
        if attention.attention_implementation(self.model.kernels, self.device) != "triton":
            raise RuntimeError("CUDA graphs need the Triton attention backend (the reference reads metadata on the host)")
        with graph_capture(self.device) as capture:
            for num_tokens in sorted(self.token_sizes, reverse=True):
                self._fill(num_tokens)
                graph, captured = capture(partial(self._forward, num_tokens))
                captured.graph = graph
                self._graphs[num_tokens] = captured

    def holds(self, num_tokens: int) -> bool:
        """Whether a graph of exactly `num_tokens` tokens was captured."""
        return num_tokens in self._graphs

    def verify_rows(self, num_tokens: int) -> TargetRows:
        """The outputs of the graph of `num_tokens` tokens as the rest of a uniform verify step reads them
        (spec_step_graphs.py): views of its static buffers, current after each of its replays."""
        captured = self._graphs[num_tokens]
        done = captured.inputs
        return TargetRows(captured.logits, done.positions, done.gathered, ModelOutput(captured.hidden, captured.aux), done.attn_metadata)

    # ---- replay --------------------------------------------------------------------------------
    def padded_tokens(self, num_tokens: int) -> int | None:
        return padded_batch_size(num_tokens, self._graphs)

    def can_run(
        self,
        num_tokens: int,
        num_sampled: int,
        meta: AttentionMetadata,
        capture_layers: tuple[int, ...],
        num_padded: int | None = None,
    ) -> bool:
        """Whether a graph holds the step: the smallest that does, or the one of `num_padded` tokens."""
        if tuple(capture_layers) != self.capture_layers or not meta.causal:
            return False
        if meta.seq_lens.shape[0] > self.layout.max_seqs or meta.block_tables.shape[1] > self.layout.width:
            return False
        padded = self.padded_tokens(num_tokens) if num_padded is None else num_padded
        return self.holds(padded) and num_tokens <= padded and num_sampled <= self.layout.num_logits(padded)

    def run(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
        indices: DeviceInputIndices,
        latest: StepFrame | None,
        num_padded: int | None = None,
    ) -> GraphStep:
        """Replay for host tensors `ids`, `positions`, host metadata and the sampled rows `logits_indices`,
        completed on the device by `indices` into the `latest` frame (ids in flight from the previous
        step, positions it moved back): the smallest graph that holds the step, or the graph of
        `num_padded` tokens (a uniform verify step's, whose rest replays on its outputs)."""
        num_tokens, num_seqs = ids.shape[0], meta.seq_lens.shape[0]
        padded = self.padded_tokens(num_tokens) if num_padded is None else num_padded
        # Invariant: run() is only called for a step that can_run() accepted, in a graph that holds it.
        if padded is None or not self.holds(padded) or padded < num_tokens:
            raise RunnerInvariantError(f"no captured graph of {padded} tokens holds a step of {num_tokens} tokens")
        self._fill(padded, ids, positions, meta, logits_indices, indices)
        if indices.gathers:
            self._source[: latest.source.shape[0]].copy_(latest.source)
        if indices.shifts and latest is not None:
            self._rejected[: latest.num_rejected.shape[0]].copy_(latest.num_rejected)
        v = self.layout.views(self._static, padded)
        captured = self._graphs[padded]
        captured.graph.replay()
        self.num_replays += 1
        num_sampled = logits_indices.shape[0]
        self.num_mixed_replays += num_sampled < num_tokens
        aux = {i: t[:num_tokens] for i, t in captured.aux.items()}
        # The step's own rows of the metadata, as of its outputs: an eager drafter after this replay attends
        # over the real sequences only (the padding has no input rows).
        done = captured.inputs
        meta = AttentionMetadata(
            v.query_start_loc[: num_seqs + 1], done.attn_metadata.seq_lens[:num_seqs], v.block_tables[:num_seqs],
            done.attn_metadata.slot_mapping[:num_tokens], causal=True,
        )  # fmt: skip
        return GraphStep(
            ModelOutput(captured.hidden[:num_tokens], aux), captured.logits[:num_sampled], done.positions[:num_tokens],
            meta, v.logits_indices[:num_sampled], done.gathered[:num_tokens],
        )  # fmt: skip
