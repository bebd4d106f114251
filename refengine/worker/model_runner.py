"""ModelRunner: builds the step's inputs from a SchedulerOutput, runs the model and verifies/samples.

State lives in `requests`, keyed by request id, never by batch row (invariant 17): the batch is
rebuilt from the SchedulerOutput every step, so a request that joins, finishes or moves to another
row never reads another request's state.

A step is split in two, as in vLLM: `execute_model` runs the forward and keeps the logits;
`sample_tokens` verifies drafts and samples. The engine's deferred branch runs other work between
the two (it applies the previous frame's output and validates drafts against constraints).

Invariant numbers refer to docs/invariants.md.
"""

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from refengine.core.outputs import ModelRunnerOutput, SchedulerOutput, StepRecord, TokenLogprobs
from refengine.model.kv_cache import KVCache
from refengine.model.transformer import ModelOutput, Transformer
from refengine.sample import rng
from refengine.sample.rejection import PLACEHOLDER_TOKEN_ID, assemble, num_accepted_greedy, verify
from refengine.sample.sampler import apply_constraints, sample
from refengine.spec_decode.proposer import DraftBatch, DraftInput, Proposer
from refengine.worker.attention_metadata_builder import build_attention_metadata
from refengine.worker.cuda_graphs import CudaGraphs
from refengine.worker.request_state import CachedRequestState


def token_logprobs(logits: torch.Tensor, token_ids: list[int], num_top: int) -> list[TokenLogprobs]:
    """Logprobs under the raw model distribution (before temperature and constraints, as vLLM reports
    by default), one row per emitted token."""
    out = []
    for row, token in zip(torch.log_softmax(logits.float(), dim=-1), token_ids, strict=True):
        top = torch.topk(row, num_top) if num_top else None
        pairs = [] if top is None else [(int(i), float(v)) for v, i in zip(top.values, top.indices, strict=True)]
        out.append(TokenLogprobs(token, float(row[token]), pairs))
    return out


# Stream of the synthetic acceptance draws (speed studies only), apart from the sampler's streams.
STREAM_SYNTHETIC_ACCEPT = 101


def synthetic_num_accepted(rate: float, key: int, first_position: int, drafts: tuple[int, ...]) -> int:
    """SYNTHETIC acceptance, for speed studies only: draft j is accepted with probability `rate`,
    independently of the tokens (a counter-based draw keyed by request and position, so sync and async
    runs accept the same drafts), up to the first rejection. A -1 placeholder is always rejected."""
    for j, draft in enumerate(drafts):
        if draft < 0 or rng.derive_seed(key, first_position + j, STREAM_SYNTHETIC_ACCEPT) / 2.0**63 >= rate:
            return j
    return len(drafts)


class RunnerInvariantError(RuntimeError):
    """The runner's per-request state contradicts what the scheduler sent."""


class InjectedFault(RuntimeError):
    """Raised on purpose by the fault-injection hook, so tests can watch the engine die honestly."""


@dataclass(frozen=True, slots=True)
class ScheduledRow:
    """One request's slice of the step."""

    state: CachedRequestState
    num_computed_tokens: int  # exact position of the first token fed this step
    num_scheduled_tokens: int
    first_row: int  # where its rows start in the flat token batch
    draft_ids: tuple[int, ...]  # the drafts fed, after filling -1 placeholders
    first_logits_row: int | None  # None: a prefill chunk that does not reach the last known token


@dataclass(frozen=True, slots=True)
class ExecutedBatch:
    rows: tuple[ScheduledRow, ...]
    logits: torch.Tensor  # [sum over sampled rows of (k + 1), vocab]
    model_output: ModelOutput | None


class ModelRunner:
    def __init__(
        self,
        model: Transformer,
        kv_cache: KVCache,
        *,
        drafter: Proposer | None = None,
        fault_after_steps: int | None = None,
        record_steps: bool = False,
        cuda_graphs: CudaGraphs | None = None,
        synthetic_acceptance_rate: float | None = None,
    ) -> None:
        self.model = model
        # Inputs are built on the host; on a GPU they travel from pinned memory, non-blocking.
        self.device = kv_cache.layers[0].key.device if kv_cache.layers else torch.device("cpu")
        self.cuda_graphs = cuda_graphs
        # Not None: a SYNTHETIC acceptance rate replaces verification (speed studies only; not lossless).
        self.synthetic_acceptance_rate = synthetic_acceptance_rate
        self.num_graph_steps = 0
        self.num_eager_steps = 0
        self.drafter = drafter
        # Per-request draft/accept history, for the oracle's sync-vs-async comparison.
        self.step_records: dict[str, list[StepRecord]] | None = {} if record_steps else None
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.requests: dict[str, CachedRequestState] = {}
        self.fault_after_steps = fault_after_steps
        self.num_steps = 0
        self._executed: ExecutedBatch | None = None

    # ---- state -------------------------------------------------------------------------------
    def _update_states(self, so: SchedulerOutput) -> None:
        gone = so.finished_req_ids | so.preempted_req_ids
        for req_id in gone:
            self.requests.pop(req_id, None)
        if self.drafter is not None and gone:
            self.drafter.remove(gone)
        for new in so.scheduled_new_reqs:
            self.requests[new.req_id] = CachedRequestState.from_new(new)
        for cached in so.scheduled_cached_reqs:
            state = self.requests.get(cached.req_id)
            # Invariant 17: a cached request is one this runner holds, found by id.
            if state is None:
                raise RunnerInvariantError(f"scheduled request {cached.req_id!r} has no runner state")
            # Invariant 18: the scheduler's count is exact (sync) or optimistic (async), never behind.
            if cached.num_computed_tokens < state.num_computed_tokens:
                raise RunnerInvariantError(
                    f"request {cached.req_id!r}: scheduler sent num_computed_tokens={cached.num_computed_tokens}, "
                    f"behind the runner's exact {state.num_computed_tokens}"
                )
            state.block_ids = cached.block_ids

    # ---- execute -----------------------------------------------------------------------------
    def execute_model(self, so: SchedulerOutput) -> None:
        if self._executed is not None:
            raise RunnerInvariantError("execute_model called twice without sample_tokens in between")
        self.num_steps += 1
        if self.fault_after_steps is not None and self.num_steps > self.fault_after_steps:
            raise InjectedFault(f"injected fault at runner step {self.num_steps}")
        self._update_states(so)

        rows: list[ScheduledRow] = []
        input_ids: list[int] = []
        positions: list[int] = []
        sample_rows: list[int] = []
        for req_id, num_scheduled in so.num_scheduled_tokens.items():
            state = self.requests[req_id]
            drafts = self._fill_drafts(state, so.scheduled_spec_decode_tokens.get(req_id, ()))
            start = state.num_computed_tokens
            num_known = num_scheduled - len(drafts)
            # Invariant 19: the fed tokens are committed ones, ending at most at the last sampled token.
            if start + num_known > state.num_tokens or num_known < 1:
                raise RunnerInvariantError(
                    f"request {req_id!r}: {num_scheduled} scheduled tokens with {len(drafts)} drafts from position "
                    f"{start}, but the runner knows only {state.num_tokens} tokens"
                )
            first_logits_row = None
            if start + num_known == state.num_tokens:
                first_logits_row = len(sample_rows)
                offset = len(input_ids) + num_known - 1
                sample_rows.extend(range(offset, offset + len(drafts) + 1))
            elif drafts:
                raise RunnerInvariantError(f"request {req_id!r}: drafts scheduled behind a prefill chunk")
            # A placeholder the runner has no draft for is fed as token 0 and verified as -1: rejected.
            input_ids += state.token_ids[start : start + num_known] + [max(d, 0) for d in drafts]
            positions += range(start, start + num_scheduled)
            rows.append(ScheduledRow(state, start, num_scheduled, len(input_ids) - num_scheduled, drafts, first_logits_row))

        if not rows:
            self._executed = ExecutedBatch((), torch.empty(0), None)
            return
        meta = build_attention_metadata(
            [r.num_computed_tokens for r in rows],
            [r.num_scheduled_tokens for r in rows],
            [r.state.block_ids for r in rows],
            self.block_size,
        )
        ids_t = torch.tensor(input_ids, dtype=torch.long)
        positions_t = torch.tensor(positions, dtype=torch.long)
        sample_t = torch.tensor(sample_rows, dtype=torch.long)
        capture_layers = () if self.drafter is None else self.drafter.capture_layers
        num_scheduled = [r.num_scheduled_tokens for r in rows]
        with torch.inference_mode():
            if (
                self.cuda_graphs is not None
                and len(sample_rows) == len(input_ids)  # every row sampled, in order
                and self.cuda_graphs.can_run(num_scheduled, meta, capture_layers)
            ):
                out, logits = self.cuda_graphs.run(ids_t, positions_t, meta, num_scheduled[0])
                self.num_graph_steps += 1
            else:
                if self.device.type == "cuda":
                    ids_t = ids_t.pin_memory().to(self.device, non_blocking=True)
                    positions_t = positions_t.pin_memory().to(self.device, non_blocking=True)
                    sample_t = sample_t.pin_memory().to(self.device, non_blocking=True)
                    meta = meta.pin_memory().to(self.device, non_blocking=True)
                out = self.model(ids_t, positions_t, meta, self.kv_cache, capture_layers=capture_layers)
                logits = self.model.compute_logits(out.hidden_states[sample_t])
                self.num_eager_steps += 1
        self._executed = ExecutedBatch(tuple(rows), logits, out)

    @staticmethod
    def _fill_drafts(state: CachedRequestState, scheduled: list[int] | tuple[int, ...]) -> tuple[int, ...]:
        """The scheduler decides how many drafts a request verifies; under async it only ships -1
        placeholders and the runner fills them from its own pending drafts, by request id."""
        return tuple(
            state.pending_drafts[j] if d == PLACEHOLDER_TOKEN_ID and j < len(state.pending_drafts) else d
            for j, d in enumerate(scheduled)
        )

    # ---- sample ------------------------------------------------------------------------------
    def sample_tokens(self, draft_overrides: Mapping[str, list[int]] | None = None) -> ModelRunnerOutput:
        """Verify and sample the executed step. `draft_overrides` replaces the drafts a request is
        verified against (the deferred constraint branch pads invalid drafts with -1, which always
        reject); the model was fed the original drafts, so only a prefix of them can be accepted."""
        executed, self._executed = self._executed, None
        if executed is None:
            raise RunnerInvariantError("sample_tokens called without execute_model")
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        logprobs: dict[str, list[TokenLogprobs]] = {}
        draft_inputs: list[DraftInput] = []
        # On a GPU: every row's argmax in one launch and one read, for the rows that need no more.
        argmax = executed.logits.argmax(dim=-1).tolist() if executed.logits.is_cuda and executed.rows else None
        for row in executed.rows:
            state = row.state
            req_ids.append(state.req_id)
            if row.first_logits_row is None:
                state.num_computed_tokens += row.num_scheduled_tokens
                sampled.append([])
                draft_inputs.append(self._draft_input(row, row.num_scheduled_tokens, propose=False))
                continue
            drafts = row.draft_ids
            if draft_overrides is not None and state.req_id in draft_overrides:
                drafts = tuple(draft_overrides[state.req_id])
            k = len(drafts)
            logits = executed.logits[row.first_logits_row : row.first_logits_row + k + 1]
            targets = None if argmax is None else argmax[row.first_logits_row : row.first_logits_row + k + 1]
            plain = targets is not None and state.num_logprobs is None and self._plain_greedy(state, k)
            if logits.is_cuda and not plain:
                logits = logits.cpu()  # the sampler's noise and constraints live on the host
            if self.synthetic_acceptance_rate is not None and k:
                tokens = self._synthetic_tokens(state, drafts, logits, targets if plain else None)
            elif plain:
                # verify()'s greedy branch when apply_constraints has nothing to mask: each row's argmax.
                accepted = num_accepted_greedy(drafts, targets)
                tokens = assemble(drafts, accepted, targets[accepted])
            else:
                tokens = verify(
                    logits,
                    drafts,
                    state.params,
                    state.token_ids,
                    state.num_output_tokens,
                    first_position=state.num_tokens,
                )
            if state.num_logprobs is not None:
                logprobs[state.req_id] = token_logprobs(logits[: len(tokens)], tokens, state.num_logprobs)
            first_draft_position = state.num_tokens
            state.token_ids += tokens
            # Every fed token up to the last accepted draft now has committed KV; the last sampled token
            # is the next step's input.
            state.num_computed_tokens = state.num_tokens - 1
            state.pending_drafts = []
            sampled.append(tokens)
            num_accepted = len(tokens) - 1
            draft_inputs.append(self._draft_input(row, row.num_scheduled_tokens - k + num_accepted, propose=True))
            if self.step_records is not None and k:
                # What was fed, not the validity-padded override: sync and async arms feed the same drafts.
                self.step_records.setdefault(state.req_id, []).append(
                    StepRecord(first_draft_position, row.draft_ids, num_accepted)
                )
        if self.drafter is not None and draft_inputs and executed.model_output is not None:
            batch = DraftBatch(
                tuple(draft_inputs), executed.model_output.hidden_states, executed.model_output.aux_hidden_states
            )
            with torch.inference_mode():
                proposals = self.drafter.propose(batch)
            for req_id, drafts in proposals.items():
                self.requests[req_id].pending_drafts = list(drafts)
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled, logprobs=logprobs)

    @staticmethod
    def _plain_greedy(state: CachedRequestState, k: int) -> bool:
        """Greedy with nothing for apply_constraints to mask on any of the k + 1 rows."""
        params = state.params
        return (
            params.greedy
            and not params.bad_words_token_ids
            and (not params.stop_token_ids or state.num_output_tokens >= params.min_tokens)
        )

    def _synthetic_tokens(
        self, state: CachedRequestState, drafts: tuple[int, ...], logits: torch.Tensor, targets: list[int] | None
    ) -> list[int]:
        """SYNTHETIC acceptance (speed studies only): accept a fixed-rate prefix of the drafts whatever
        the target says, then emit the target's token at the first unaccepted row."""
        if self.synthetic_acceptance_rate is None:
            raise RunnerInvariantError("synthetic tokens requested without a synthetic acceptance rate")
        first = state.num_tokens
        accepted = synthetic_num_accepted(self.synthetic_acceptance_rate, state.params.rng_key, first, drafts)
        if targets is not None:
            final = targets[accepted]
        else:
            history = [*state.token_ids, *drafts[:accepted]]
            row = apply_constraints(logits[accepted], state.params, history, state.num_output_tokens + accepted)
            final = sample(row, state.params, first + accepted)
        return assemble(drafts, accepted, final)

    @staticmethod
    def _draft_input(row: ScheduledRow, num_valid_rows: int, *, propose: bool) -> DraftInput:
        return DraftInput(
            req_id=row.state.req_id,
            token_ids=row.state.token_ids,
            first_position=row.num_computed_tokens,
            num_valid_rows=num_valid_rows,
            rows=slice(row.first_row, row.first_row + num_valid_rows),
            block_ids=row.state.block_ids,
            propose=propose,
        )

    def take_step_records(self, req_id: str) -> list[StepRecord]:
        """A finished request's per-step drafts and acceptance (empty unless built with record_steps)."""
        return [] if self.step_records is None else self.step_records.pop(req_id, [])

    def take_draft_token_ids(self) -> dict[str, list[int]]:
        """Sync scheduling only: the drafts proposed after this step, for the scheduler to schedule."""
        return {req_id: list(s.pending_drafts) for req_id, s in self.requests.items() if s.pending_drafts}
