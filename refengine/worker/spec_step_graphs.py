"""A uniform verify step (step_plan.py's word) after the target's forward, as a graph per padded batch
size P and variant (docs/design/cuda-graphs.md): the sampler's step, the drafter's whole step and the
frame's columns, the general way's own functions, on the outputs of the target's graph of P * (k + 1)
tokens. The host stages the rows' sampling parameters and drafting limits in one copy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from refengine.model.graphs import GraphPool, GraphSet
from refengine.model.static_buffers import BufferSet, Field
from refengine.sample.metadata import SamplingMetadata
from refengine.spec_decode.draft_graphs import DraftGraphs
from refengine.spec_decode.proposer import PaddedDraftBatch
from refengine.worker.input_batch import InputBatch
from refengine.worker.sampler_graphs import RejectionSamplerGraphs, SamplerGraphKey
from refengine.worker.step_frame import FrameColumns, frame_columns, rejected_drafts
from refengine.worker.step_rows import ScheduledRow
from refengine.worker.target_step import TargetStep

_PARAMS = ("temperature", "top_p", "top_k", "key_words")


@dataclass(frozen=True, slots=True)
class SampledStep:
    """A uniform step's results on the device, one row per request of P: the step's first, then padding."""

    tokens: torch.Tensor  # [P, k + 1], -1 after the valid ones
    proposed: torch.Tensor  # [P, k]: the drafts proposed after it
    frame: FrameColumns


class SpecStepGraphs:
    def __init__(self, sampler: RejectionSamplerGraphs, drafter: DraftGraphs, device: torch.device) -> None:
        self.sampler, self.drafter = sampler, drafter
        self.k, self.q = sampler.k, sampler.q
        self.batch_sizes = drafter.batch_sizes
        rows, b = self.batch_sizes[-1] * self.q, self.batch_sizes[-1]
        self.buffers = BufferSet(device, dict(
            temperature=Field((rows,), dtype=torch.float32), top_p=Field((rows,), 1, torch.float32),
            top_k=Field((rows,)), key_words=Field((rows,)), limit=Field((b,)),  # padding drafts nothing
        ))  # fmt: skip
        self.graphs: GraphSet[SamplerGraphKey, SampledStep] = GraphSet("uniform step", self._step)
        # Each captured key's target rows (the target graph's outputs); an eager step's own rows.
        self._captured: dict[SamplerGraphKey, TargetStep] = {}
        self._rows: TargetStep | None = None
        self.captured_sizes: list[int] = []  # the P with graphs (none: every step runs eagerly)

    def _step(self, key: SamplerGraphKey) -> SampledStep:
        return self.step(key, self._captured.get(key, self._rows))

    def step(self, key: SamplerGraphKey, rows: TargetStep) -> SampledStep:
        """Verify P requests' rows, draft after them and lay out the frame: tensor ops only."""
        p, q, n, b = key.padded, self.q, key.padded * self.q, self.buffers
        positions = rows.inputs.positions[:n]
        # Row j of a request decides the position after its fed row j; its drafts are the ids it fed after
        # its first row, as the latest frame proposed them.
        md = SamplingMetadata.unmasked(
            **{name: b[name][:n] for name in _PARAMS}, positions=positions + 1,
            all_greedy=key.greedy, any_top_k=False, any_top_p=False,
        )  # fmt: skip
        drafts = rows.inputs.gathered[:n].view(p, q)[:, 1:]
        self.sampler.fill(rows.logits[:n], md, drafts, key)
        tokens = self.sampler.step(key)
        out = rows.model_output
        batch = PaddedDraftBatch(
            self.drafter.requests(p), tokens.reshape(-1).clamp(min=0),  # a rejected row's input is any valid id
            rejected_drafts(tokens, self.k), out.hidden_states[:n], {i: t[:n] for i, t in out.aux_hidden_states.items()},
            positions, rows.inputs.attn_metadata,
        )  # fmt: skip
        self.drafter.fill_step(batch, b["limit"][:p], p)
        proposed = self.drafter.step(p)
        return SampledStep(tokens, proposed, frame_columns(tokens, positions.view(p, q)[:, 0], drafts, proposed, self.k))

    def capture(self, pool: GraphPool, target_rows) -> None:
        """One graph per batch size and variant, on the outputs of the target's graph of P * (k + 1) tokens
        (`target_rows(T)`, None where the target has no such graph)."""
        for padded in reversed(self.batch_sizes):
            rows = target_rows(padded * self.q)
            for greedy in () if rows is None else (True, False):
                self._captured[SamplerGraphKey(padded, greedy, False, False, False)] = rows
        self.graphs.capture(pool, list(self._captured))
        self.captured_sizes = sorted({key.padded for key in self._captured})

    def run(self, key: SamplerGraphKey, verified: Sequence[ScheduledRow], input_batch: InputBatch, rows: TargetStep) -> SampledStep:
        """The `verified` requests' step, right after the target's graph of P = `key.padded` requests."""
        # The rows' parameters, and greedy padding without drafts behind them, into the buffers.
        batch_rows = np.repeat(np.asarray([r.batch_row for r in verified], dtype=np.int64), self.q)
        limits = [self.drafter.drafter.position_limit(r.state.block_ids) for r in verified]
        b = self.buffers
        b.begin()
        for name in _PARAMS:
            b.put(name, getattr(input_batch, name)[batch_rows], key.padded * self.q)
        b.put("limit", np.asarray(limits, dtype=np.int64), key.padded)
        b.send()
        self._rows = rows
        return self.graphs.run(key)
