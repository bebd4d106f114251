"""The step plan: what `execute_model` does on the host before it launches anything, as one frozen
value. `plan_rows` lays the scheduled rows out (which ids and drafts the device fills in from the
latest frame), and `Dispatcher.decide` makes the step's one choice of way: the target's graph or eager,
the uniform step or the general one, the sampler's graph, the drafter's graph (docs/design/cuda-graphs.md).

Invariant numbers refer to docs/invariants.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.graphs import GraphStats, padded_batch_size
from refengine.spec_decode.draft_graphs import DraftGraphs
from refengine.spec_decode.proposer import DraftGraph
from refengine.worker.input_batch import InputBatch
from refengine.worker.request_state import CachedRequestState
from refengine.worker.sampler_graphs import VARIANTS, RejectionSamplerGraphs, SamplerGraphKey
from refengine.worker.spec_step_graphs import SpecStepGraphs
from refengine.worker.step_rows import ScheduledRow, StepWay
from refengine.worker.target_graphs import TargetGraphs


@dataclass(frozen=True, slots=True)
class StepPlan:
    rows: tuple[ScheduledRow, ...]
    sample_rows: tuple[int, ...]  # flat rows whose logits are sampled
    gather_at: tuple[int, ...]  # flat input rows filled on the device ...
    gather_from: tuple[int, ...]  # ... from these entries of the latest frame's source
    fill_slots: tuple[int, ...]  # verify-draft slots filled on the device, and their flat input rows
    fill_rows: tuple[int, ...]
    sources: tuple[int, ...]  # per row: its sampled row in the latest frame if that fed drafts, else -1
    host_starts: tuple[int, ...]
    host_shift: tuple[int, ...]  # per row: the scheduler's count less the runner's

    @property
    def num_fed(self) -> int:
        return sum(r.num_scheduled_tokens for r in self.rows)


def uniform_step_honours(states: list[CachedRequestState], batch_rows: list[int], input_batch: InputBatch) -> bool | None:
    """Whether the one-graph uniform step honours these requests' sampling, and if so whether it is
    greedy (None: it does not). What it honours is declared once, per sampling parameter, in
    sample/step_support.py (each request's `uniform_step`): no logprobs, constraint or min_tokens, whose
    masks, overrides and read-backs the general way serves; top-k and top-p only on greedy rows."""
    if not all(s.uniform_step for s in states):
        return None
    return not input_batch.temperature[np.asarray(batch_rows, dtype=np.int64)].any()


class Dispatcher:
    """The only place a step's way is chosen, from the graphs the engine captured (None: none)."""

    def __init__(
        self, k: int, input_batch: InputBatch, target: TargetGraphs | None, sampler: RejectionSamplerGraphs | None,
        uniform: SpecStepGraphs | None, draft_graphs: DraftGraphs | None, capture_layers: tuple[int, ...],
    ) -> None:  # fmt: skip
        self.k, self.input_batch = k, input_batch
        self.target, self.sampler, self.uniform, self.draft_graphs = target, sampler, uniform, draft_graphs
        # The batch sizes the drafter's graphs were captured at (none: it drafts eagerly).
        self.draft_sizes = [] if draft_graphs is None else draft_graphs.batch_sizes
        self.capture_layers = capture_layers

    def graph_stats(self) -> tuple[GraphStats, ...]:
        """What every graph set captured and replayed, read-only (the profiler's view)."""
        sets = (self.target, self.sampler, self.uniform)
        stats = tuple(s.graphs.stats for s in sets if s is not None)
        d = self.draft_graphs
        return stats + (() if d is None else (d.steps.stats, d.proposals.stats))

    def decide(self, plan: StepPlan, meta: AttentionMetadata) -> StepWay:
        verified = [r for r in plan.rows if r.first_logits_row is not None]
        uniform = self._uniform(plan, verified)
        target = self._target(plan, meta, None if uniform is None else uniform.padded * (self.k + 1))
        if uniform is not None and target is None and self.target is not None:
            uniform = None  # its target graph does not hold the step: the general way, eager
            target = self._target(plan, meta, None)
        if uniform is not None:
            return StepWay(target, uniform, None, None)
        return StepWay(target, None, self._sampler(verified), self._drafter(plan.rows, verified))

    def _target(self, plan: StepPlan, meta: AttentionMetadata, num_padded: int | None) -> int | None:
        return self.target_tokens(plan.num_fed, len(plan.sample_rows), meta, num_padded)

    def target_tokens(self, t: int, num_sampled: int, meta: AttentionMetadata, num_padded: int | None = None) -> int | None:
        """The smallest target graph that holds a step of `t` tokens (or the one of `num_padded` tokens):
        the step's own, or one the verify-cost table is measured with (verify_cost.py)."""
        g = self.target
        if g is None or self.capture_layers != g.capture_layers or not meta.causal:
            return None
        if meta.seq_lens.shape[0] > g.max_seqs or meta.block_tables.shape[1] > g.width:
            return None
        padded = padded_batch_size(t, g.graphs.captured) if num_padded is None else num_padded
        ok = padded is not None and g.graphs.holds(padded) and t <= padded and num_sampled <= g.num_logits(padded)
        return padded if ok else None

    def _uniform(self, plan: StepPlan, verified: list[ScheduledRow]) -> SamplerGraphKey | None:
        """Every request verifies k drafts that are all on the device, and the step honours its sampling.
        Tensor parallelism (no uniform graphs) broadcasts the sampled ids between verify and draft."""
        g = self.uniform
        if g is None or len(plan.fill_slots) != len(plan.rows) * self.k or len(verified) != len(plan.rows):
            return None
        if any(r.num_scheduled_tokens != self.k + 1 for r in plan.rows):
            return None
        greedy = uniform_step_honours([r.state for r in plan.rows], [r.batch_row for r in plan.rows], self.input_batch)
        if greedy is None:
            return None
        captured, n = g.captured_sizes, len(plan.rows)
        # Nothing captured (the CPU): the step runs eagerly at its own size.
        padded = padded_batch_size(n, captured) if captured else (n if n <= g.batch_sizes[-1] else None)
        return None if padded is None else SamplerGraphKey(padded, greedy, False, False, False)

    def _sampler(self, verified: list[ScheduledRow]) -> SamplerGraphKey | None:
        """The rejection sampler's graph: every request verifies k drafts, its variant from host facts
        (masks where a constraint may forbid a token)."""
        g = self.sampler
        if g is None or not verified or any(len(r.draft_ids) != self.k for r in verified):
            return None
        padded = padded_batch_size(len(verified), g.batch_sizes)
        rows = np.asarray([r.batch_row for r in verified], dtype=np.int64)
        greedy = not self.input_batch.temperature[rows].any()
        masked = any(
            r.state.constrained or r.state.params.bad_words_token_ids or r.state.num_output_tokens < r.state.params.min_tokens
            for r in verified
        )
        top_k = not greedy and bool((self.input_batch.top_k[rows] > 0).any())
        top_p = not greedy and bool((self.input_batch.top_p[rows] < 1.0).any())
        key = None if padded is None else SamplerGraphKey(padded, greedy, masked, top_k, top_p)
        return key if key is not None and (key.greedy, key.masked, key.top_k, key.top_p) in VARIANTS and g.graphs.holds(key) else None

    def _drafter(self, rows: tuple[ScheduledRow, ...], verified: list[ScheduledRow]) -> DraftGraph | None:
        """The drafter's whole step where every request proposes from k + 1 fed rows, else its proposal
        alone, at a captured size."""
        if not self.draft_sizes or not rows:
            return None
        padded = padded_batch_size(len(rows), self.draft_sizes)
        if padded is not None and len(verified) == len(rows) and all(r.num_scheduled_tokens == self.k + 1 for r in rows):
            return DraftGraph(True, padded)
        padded = padded_batch_size(len(verified), self.draft_sizes)
        return None if padded is None or not verified else DraftGraph(False, padded)
