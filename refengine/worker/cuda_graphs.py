"""CUDA graphs of the model's decode and verify steps: forward plus logits, one graph per
(query length, padded batch size).

A step qualifies when every sequence feeds the same number of tokens q (1 for decode, k + 1 for a
verify of k drafts), every row is sampled, and the batch fits a captured size. Its inputs are copied
into static buffers (one host-to-device copy from a pinned staging buffer) and the smallest captured
batch of at least its size is replayed. Padded sequences have seq_len 0 and slot -1: they write no KV
(the store skips slot -1) and attend over nothing (their rows come out zero), and the rows are cut off
before anyone sees them.

Capture needs attention that never reads device values on the host, i.e. the Triton backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from refengine.model import attention
from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.cuda_graph_sizes import default_batch_sizes, padded_batch_size
from refengine.model.graph_capture import graph_capture
from refengine.model.kv_cache import KVCache
from refengine.model.transformer import ModelOutput, Transformer
from refengine.worker.device_inputs import DeviceInputs


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    hidden: torch.Tensor
    aux: dict[int, torch.Tensor]
    logits: torch.Tensor


class CudaGraphs:
    def __init__(
        self,
        model: Transformer,
        kv_cache: KVCache,
        *,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        query_lens: tuple[int, ...] = (1,),
        capture_layers: tuple[int, ...] = (),
        batch_sizes: list[int] | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        self.query_lens = tuple(sorted(set(query_lens)))
        self.capture_layers = tuple(capture_layers)
        self.batch_sizes = batch_sizes or default_batch_sizes(max_num_seqs)
        self.max_batch = max(self.batch_sizes)
        self.width = max_blocks_per_seq
        self.max_tokens = self.max_batch * max(self.query_lens)
        # One int64 buffer: [ids | positions | slots] x max_tokens, [query_start_loc] x (max_batch + 1),
        # [seq_lens] x max_batch, [block_tables] x max_batch * width.
        t, b = self.max_tokens, self.max_batch
        self._offsets = (0, t, 2 * t, 3 * t, 3 * t + b + 1, 3 * t + 2 * b + 1)
        size = self._offsets[-1] + b * self.width
        self._staging = torch.zeros(size, dtype=torch.int64).pin_memory()
        self._static = torch.zeros(size, dtype=torch.int64, device=self.device)
        self._copied = torch.cuda.Event()
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self.num_replays = 0

    # ---- views ---------------------------------------------------------------------------------
    def _views(self, buffer: torch.Tensor, q: int, batch: int):
        o = self._offsets
        tokens = batch * q
        ids = buffer[o[0] : o[0] + tokens]
        positions = buffer[o[1] : o[1] + tokens]
        slots = buffer[o[2] : o[2] + tokens]
        starts = buffer[o[3] : o[3] + batch + 1]
        seq_lens = buffer[o[4] : o[4] + batch]
        tables = buffer[o[5] :].view(self.max_batch, self.width)[:batch]
        return ids, positions, slots, starts, seq_lens, tables

    def _fill(self, q: int, padded: int, ids=None, positions=None, meta: AttentionMetadata | None = None) -> None:
        """Stage a step (or, without one, pure padding) and copy it to the static buffers."""
        self._copied.synchronize()  # the previous copy has left the staging buffer
        s_ids, s_pos, s_slots, s_starts, s_lens, s_tables = self._views(self._staging, q, padded)
        num_seqs = 0 if meta is None else meta.seq_lens.shape[0]
        tokens = num_seqs * q
        if meta is not None:
            s_ids[:tokens] = ids
            s_pos[:tokens] = positions
            s_slots[:tokens] = meta.slot_mapping
            s_starts[: num_seqs + 1] = meta.query_start_loc
            s_lens[:num_seqs] = meta.seq_lens
            width = meta.block_tables.shape[1]
            s_tables[:num_seqs, :width] = meta.block_tables
            s_tables[:num_seqs, width:] = 0
        s_ids[tokens:] = 0
        s_pos[tokens:] = 0
        s_slots[tokens:] = -1  # padding writes no KV
        s_starts[num_seqs + 1 :] = torch.arange(1, padded - num_seqs + 1) * q + tokens
        if meta is None:
            s_starts[0] = 0
        s_lens[num_seqs:] = 0  # and attends over nothing
        s_tables[num_seqs:] = 0
        used = self._offsets[-1] + padded * self.width
        self._static[:used].copy_(self._staging[:used], non_blocking=True)
        self._copied.record()

    def _forward(self, q: int, padded: int) -> _Graph:
        ids, positions, slots, starts, seq_lens, tables = self._views(self._static, q, padded)
        meta = AttentionMetadata(starts, seq_lens, tables, slots, causal=True)
        out = self.model(ids, positions, meta, self.kv_cache, capture_layers=self.capture_layers)
        logits = self.model.compute_logits(out.hidden_states)
        return _Graph(None, out.hidden_states, out.aux_hidden_states, logits)  # type: ignore[arg-type]

    # ---- capture -------------------------------------------------------------------------------
    def capture(self) -> None:
        if attention.attention_implementation(self.model.kernels, self.device) != "triton":
            raise RuntimeError("CUDA graphs need the Triton attention backend (the reference reads metadata on the host)")
        with graph_capture(self.device) as capture:
            for q in self.query_lens:
                for padded in sorted(self.batch_sizes, reverse=True):
                    self._fill(q, padded)
                    graph, captured = capture(partial(self._forward, q, padded))
                    captured.graph = graph
                    self._graphs[(q, padded)] = captured

    # ---- replay --------------------------------------------------------------------------------
    def padded_size(self, num_seqs: int, q: int) -> int | None:
        if q not in self.query_lens:
            return None
        return padded_batch_size(num_seqs, (b for captured_q, b in self._graphs if captured_q == q))

    def can_run(self, num_scheduled: list[int], meta: AttentionMetadata, capture_layers: tuple[int, ...]) -> bool:
        if not num_scheduled or len(set(num_scheduled)) != 1 or tuple(capture_layers) != self.capture_layers:
            return False
        if meta.block_tables.shape[1] > self.width or not meta.causal:
            return False
        return self.padded_size(len(num_scheduled), num_scheduled[0]) is not None

    def run(
        self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, q: int, device_inputs: DeviceInputs | None
    ) -> tuple[ModelOutput, torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Replay for host tensors `ids`, `positions` and host metadata, completed on the device by
        `device_inputs` (ids in flight from the previous step, positions it moved back). Returns the
        outputs, logits, positions and metadata of the step's real rows: views of the graph's static
        buffers, valid until the next replay."""
        num_seqs = meta.seq_lens.shape[0]
        padded = self.padded_size(num_seqs, q)
        # Invariant: run() is only called for a step that can_run() accepted.
        if padded is None:
            raise RuntimeError(f"no captured graph for {num_seqs} sequences of {q} tokens")
        self._fill(q, padded, ids, positions, meta)
        s_ids, s_pos, s_slots, s_starts, s_lens, s_tables = self._views(self._static, q, padded)
        static_meta = AttentionMetadata(s_starts, s_lens, s_tables, s_slots, causal=True)
        if device_inputs is not None:
            device_inputs.apply(s_ids, s_pos, static_meta, self.kv_cache.block_size)
        captured = self._graphs[(q, padded)]
        captured.graph.replay()
        self.num_replays += 1
        tokens = num_seqs * q
        aux = {i: t[:tokens] for i, t in captured.aux.items()}
        # The step's own rows of the metadata, as of its outputs: an eager drafter after this replay attends
        # over the real sequences only (the padded ones have no input rows).
        meta = AttentionMetadata(
            s_starts[: num_seqs + 1], s_lens[:num_seqs], s_tables[:num_seqs], s_slots[:tokens], causal=True
        )
        return ModelOutput(captured.hidden[:tokens], aux), captured.logits[:tokens], s_pos[:tokens], meta
