"""The target's step (target_step.py) as a graph per token count T (docs/design/cuda-graphs.md): any
step of at most T tokens and max_seqs sequences, its rows first, then one padding sequence of seq_len 0
and slot -1 (no KV write, no keys), cut off after the replay. Capture needs Triton attention."""

from __future__ import annotations

import numpy as np
import torch

from refengine.model import attention
from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.graphs import GraphPool, GraphSet
from refengine.model.kv_cache import KVCache
from refengine.model.static_buffers import BufferSet, Field
from refengine.model.transformer import ModelOutput, Transformer
from refengine.worker.device_inputs import CompletedInputs, DeviceInputIndices, DeviceInputs
from refengine.worker.errors import RunnerInvariantError
from refengine.worker.step_frame import StepFrame
from refengine.worker.target_step import TargetStep, forward


def target_fields(max_tokens: int, max_seqs: int, max_logits: int, width: int) -> dict[str, Field]:
    t, b = max_tokens, max_seqs + 1  # the step's sequences and the padding one
    return dict(
        ids=Field((t,)), positions=Field((t,)), slots=Field((t,), pad=-1), query_start_loc=Field((b + 1,)),
        seq_lens=Field((b,)), block_tables=Field((b, width)), logits_indices=Field((max_logits,)),
        take=Field((t,), pad=-1), seq_of_token=Field((t,)), seq_source=Field((b,), pad=-1), seq_shift=Field((b,)),
        # The latest frame's source ids and rejected counts (step_frame.py); the last rejected entry stays
        # 0, what a sequence without a frame row reads.
        source=Field((max_logits,), staged=False), rejected=Field((b,), staged=False),
    )  # fmt: skip


class TargetGraphs:
    """The target's buffers and its graph per token count T (the dispatcher, step_plan.py, picks T)."""

    def __init__(
        self, model: Transformer, kv_cache: KVCache, token_sizes: list[int], batch_sizes: list[int],
        *, max_num_seqs: int, max_logits: int, max_blocks_per_seq: int, capture_layers: tuple[int, ...] = (),
    ) -> None:  # fmt: skip
        self.model, self.kv_cache, self.capture_layers = model, kv_cache, tuple(capture_layers)
        self.token_sizes, self.batch_sizes = token_sizes, batch_sizes
        self.max_seqs, self.max_logits, self.width = max_num_seqs, max_logits, max_blocks_per_seq
        self.buffers = BufferSet(kv_cache.device, target_fields(max(token_sizes), max_num_seqs, max_logits, max_blocks_per_seq))
        self.graphs: GraphSet[int, TargetStep] = GraphSet("target", self._step, persist=False)
        # Replays of steps with rows that sample nothing (a prefill chunk): the mixed path ran.
        self.num_mixed_replays = 0

    def num_logits(self, num_tokens: int) -> int:
        return min(num_tokens, self.max_logits)

    def static_inputs(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor, DeviceInputs]:
        """The graph of T = `num_tokens` tokens' inputs: views of the buffers."""
        b = self.buffers
        meta = AttentionMetadata(b["query_start_loc"], b["seq_lens"], b["block_tables"], b["slots"][:num_tokens], causal=True)
        inputs = DeviceInputs(b["take"][:num_tokens], b["seq_source"], b["seq_shift"], b["seq_of_token"][:num_tokens], b["source"], b["rejected"])
        return b["ids"][:num_tokens], b["positions"][:num_tokens], meta, b["logits_indices"][: self.num_logits(num_tokens)], inputs

    def _step(self, num_tokens: int) -> TargetStep:
        return forward(self.model, self.kv_cache, *self.static_inputs(num_tokens), self.capture_layers)

    def capture(self, pool: GraphPool) -> None:
        if attention.attention_implementation(self.model.kernels, self.kv_cache.device) != "triton":
            raise RuntimeError("CUDA graphs need the Triton attention backend (the reference reads metadata on the host)")
        self.graphs.capture(pool, sorted(self.token_sizes, reverse=True), self.stage)  # pure padding

    def stage(self, num_tokens: int, ids=None, positions=None, meta=None, logits_indices=None, indices=None) -> None:
        """A step (or, without one, pure padding) into the buffers of a T = `num_tokens` graph, sent in
        one copy; a step comes with its device completion's `indices`."""
        n = 0 if meta is None else meta.seq_lens.shape[0]
        t = 0 if meta is None else meta.slot_mapping.shape[0]
        s = 0 if logits_indices is None else logits_indices.shape[0]
        # A step replays only a graph that holds all its tokens, sequences, sampled rows and blocks (the
        # dispatcher's choice); anything else would be cut off silently.
        if meta is not None and (t > num_tokens or n > self.max_seqs or s > self.num_logits(num_tokens) or meta.block_tables.shape[1] > self.width):
            raise RunnerInvariantError(f"a step of {t} tokens, {n} sequences and {s} sampled rows does not fit a graph of {num_tokens} tokens")
        none = np.zeros(0, dtype=np.int64)
        logits_indices = none if logits_indices is None else logits_indices
        if meta is None:
            ids = positions = none
            meta = AttentionMetadata(torch.zeros(1, dtype=torch.int64), none, none.reshape(0, 0), none, causal=True)
            indices = DeviceInputIndices(none, none, none, none, gathers=False, shifts=False)
        b, seqs = self.buffers, self.max_seqs + 1
        b.begin()
        for name, value, upto, pad in (
            ("ids", ids, num_tokens, None), ("positions", positions, num_tokens, None),
            ("slots", meta.slot_mapping, num_tokens, None),  # padding writes no KV ...
            ("query_start_loc", meta.query_start_loc, seqs + 1, num_tokens),  # the padding sequence ends at T
            ("seq_lens", meta.seq_lens, seqs, None), ("block_tables", meta.block_tables, seqs, None),  # ... attends over nothing
            ("logits_indices", logits_indices, self.num_logits(num_tokens), None),
            ("take", indices.take, num_tokens, None), ("seq_source", indices.seq_source, seqs, None),
            ("seq_shift", indices.seq_shift, seqs, None),
            ("seq_of_token", indices.seq_of_token, num_tokens, n),  # the padding sequence's rows move by its shift, 0
        ):  # fmt: skip
            b.put(name, value, upto, pad)
        b.send()

    def run(
        self, num_tokens: int, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
        logits_indices: torch.Tensor, indices: DeviceInputIndices, latest: StepFrame | None,
    ) -> TargetStep:  # fmt: skip
        """Replay the graph of `num_tokens` tokens for a step the dispatcher gave it: host tensors,
        completed on the device by `indices` into the `latest` frame. Views of the graph's outputs."""
        t, n, s = ids.shape[0], meta.seq_lens.shape[0], logits_indices.shape[0]
        if not self.graphs.holds(num_tokens) or num_tokens < t:
            raise RunnerInvariantError(f"no captured graph of {num_tokens} tokens holds a step of {t} tokens")
        self.stage(num_tokens, ids, positions, meta, logits_indices, indices)
        if indices.gathers:
            self.buffers["source"][: latest.source.shape[0]].copy_(latest.source)
        if indices.shifts and latest is not None:
            self.buffers["rejected"][: latest.num_rejected.shape[0]].copy_(latest.num_rejected)
        out = self.graphs.run(num_tokens)
        self.num_mixed_replays += s < t
        done, m = out.inputs, out.inputs.attn_metadata
        # The step's own rows of the metadata: an eager drafter after this replay attends over them only.
        meta = AttentionMetadata(m.query_start_loc[: n + 1], m.seq_lens[:n], m.block_tables[:n], m.slot_mapping[:t], causal=True)
        hidden = ModelOutput(out.model_output.hidden_states[:t], {i: a[:t] for i, a in out.model_output.aux_hidden_states.items()})
        inputs = CompletedInputs(done.ids[:t], done.positions[:t], meta, done.gathered[:t])
        return TargetStep(hidden, out.logits[:s], inputs, out.logits_indices[:s])
