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
from refengine.sample.metadata import RowParams, SamplingMetadata
from refengine.sample.rejection import PLACEHOLDER_TOKEN_ID
from refengine.sample.sampler import masked_token_ids, sample_batch
from refengine.spec_decode.proposer import DraftBatch, DraftInput, Proposer
from refengine.worker.async_output import AsyncModelRunnerOutput, InFlightTokens
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
        if draft < 0 or rng.uniform(key, first_position + j, STREAM_SYNTHETIC_ACCEPT) >= rate:
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
        # Steps whose sampled ids are still on their way to the host, oldest first (at most two).
        self._in_flight: list[InFlightTokens] = []
        # Launches that found the previous step's sampled ids not yet landed: the GPU overlap witness.
        self.num_overlapped_launches = 0
        # Steps whose ids went in flight, and input ids gathered on the device: the path ran.
        self.num_in_flight_steps = 0
        self.num_gathered_inputs = 0

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
        latest = self._land_in_flight(keep_latest=True)
        latest_row = {} if latest is None else {s.req_id: r for r, s in enumerate(latest.states)}
        gather_at: list[int] = []  # flat input positions filled on the device ...
        gather_from: list[int] = []  # ... from these rows of the latest step's sampled ids

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
            fed = state.token_ids[start : start + num_known]
            if fed[-1] == PLACEHOLDER_TOKEN_ID:
                # Invariant 19: only the last sampled token may still be in flight, from the latest step.
                if req_id not in latest_row or PLACEHOLDER_TOKEN_ID in fed[:-1]:
                    raise RunnerInvariantError(f"request {req_id!r}: an input token in flight outside the latest step")
                gather_at.append(len(input_ids) + num_known - 1)
                gather_from.append(latest_row[req_id])
            # A placeholder the runner has no draft for is fed as token 0 and verified as -1: rejected.
            input_ids += fed + [max(d, 0) for d in drafts]
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
        gather = self._input_gather(latest, gather_at, gather_from)
        if latest is not None and not latest.is_ready():
            self.num_overlapped_launches += 1
        with torch.inference_mode():
            if (
                self.cuda_graphs is not None
                and len(sample_rows) == len(input_ids)  # every row sampled, in order  # pragma: no mutate
                and self.cuda_graphs.can_run(num_scheduled, meta, capture_layers)  # pragma: no mutate
            ):
                # CUDA graphs exist only on a GPU: CPU mutation testing cannot reach this branch.
                # pragma: no mutate block
                out, logits = self.cuda_graphs.run(ids_t, positions_t, meta, num_scheduled[0], gather)
                self.num_graph_steps += 1
            else:
                if self.device.type == "cuda":
                    # Pinned host-to-device copies run only on a GPU, out of CPU mutation testing's reach.
                    # pragma: no mutate block
                    ids_t = ids_t.pin_memory().to(self.device, non_blocking=True)
                    positions_t = positions_t.pin_memory().to(self.device, non_blocking=True)
                    sample_t = sample_t.pin_memory().to(self.device, non_blocking=True)
                    meta = meta.pin_memory().to(self.device, non_blocking=True)
                if gather is not None:
                    ids_t = ids_t.to(self.device).index_copy_(0, *gather)
                out = self.model(ids_t, positions_t, meta, self.kv_cache, capture_layers=capture_layers)
                logits = self.model.compute_logits(out.hidden_states[sample_t])
                self.num_eager_steps += 1
        self._executed = ExecutedBatch(tuple(rows), logits, out)

    def _input_gather(
        self, latest: InFlightTokens | None, at: list[int], rows: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(flat input positions, their ids) on the device: the latest step's sampled ids, never read by
        the host. One small host-to-device copy of the indices; the ids themselves do not move."""
        if latest is None or not at:
            return None
        self.num_gathered_inputs += len(at)
        index = torch.tensor(at + rows, dtype=torch.int64)
        if self.device.type == "cuda":
            index = index.pin_memory().to(self.device, non_blocking=True)  # pragma: no mutate
        return index[: len(at)], latest.device[index[len(at) :], 0]

    @staticmethod
    def _fill_drafts(state: CachedRequestState, scheduled: list[int] | tuple[int, ...]) -> tuple[int, ...]:
        """The scheduler decides how many drafts a request verifies; under async it only ships -1
        placeholders and the runner fills them from its own pending drafts, by request id."""
        return tuple(
            state.pending_drafts[j] if d == PLACEHOLDER_TOKEN_ID and j < len(state.pending_drafts) else d
            for j, d in enumerate(scheduled)
        )

    # ---- sample ------------------------------------------------------------------------------
    def sample_tokens(
        self, draft_overrides: Mapping[str, list[int]] | None = None
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        """Verify and sample the executed step. `draft_overrides` replaces the drafts a request is
        verified against (the deferred constraint branch pads invalid drafts with -1, which always
        reject); the model was fed the original drafts, so only a prefix of them can be accepted.

        In the common path (no drafts, no logprobs, no bad words) the sampled ids stay on the device and
        the output comes back in flight: nothing here waits for the device. Otherwise the ids are read
        back here, because the drafter, the logprobs or the next bad-words mask need them on the host."""
        executed, self._executed = self._executed, None
        if executed is None:
            raise RunnerInvariantError("sample_tokens called without execute_model")
        verified = [r for r in executed.rows if r.first_logits_row is not None]
        drafts_by_req = {
            r.state.req_id: tuple(draft_overrides[r.state.req_id])
            if draft_overrides is not None and r.state.req_id in draft_overrides
            else r.draft_ids
            for r in verified
        }
        tokens = self._verify(executed.logits, verified, drafts_by_req) if verified else None
        in_flight = (
            tokens is not None
            and tokens.shape[1] == 1
            and self.drafter is None
            and all(r.state.num_logprobs is None and not r.state.params.bad_words_token_ids for r in verified)
        )
        if in_flight:
            return self._send_in_flight(executed.rows, verified, tokens)
        token_rows = [] if tokens is None else [[t for t in row if t != PLACEHOLDER_TOKEN_ID] for row in tokens.tolist()]
        tokens_by_req = dict(zip((r.state.req_id for r in verified), token_rows, strict=True))

        req_ids: list[str] = []
        sampled: list[list[int]] = []
        logprobs: dict[str, list[TokenLogprobs]] = {}
        draft_inputs: list[DraftInput] = []
        for row in executed.rows:
            state = row.state
            req_ids.append(state.req_id)
            if row.first_logits_row is None:
                state.num_computed_tokens += row.num_scheduled_tokens
                sampled.append([])
                draft_inputs.append(self._draft_input(row, row.num_scheduled_tokens, propose=False))
                continue
            k = len(row.draft_ids)
            tokens_of_row = tokens_by_req[state.req_id]
            if state.num_logprobs is not None:
                first = row.first_logits_row
                logprobs[state.req_id] = token_logprobs(
                    executed.logits[first : first + len(tokens_of_row)], tokens_of_row, state.num_logprobs
                )
            first_draft_position = state.num_tokens
            state.token_ids += tokens_of_row
            # Every fed token up to the last accepted draft now has committed KV; the last sampled token
            # is the next step's input.
            state.num_computed_tokens = state.num_tokens - 1
            state.pending_drafts = []
            sampled.append(tokens_of_row)
            num_accepted = len(tokens_of_row) - 1
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

    def _send_in_flight(
        self, rows: tuple[ScheduledRow, ...], verified: list[ScheduledRow], tokens: torch.Tensor
    ) -> AsyncModelRunnerOutput:
        """One token per sampled request, left on the device: each request's token_ids gets a -1
        placeholder that the next step's input gather fills on the device and that is patched on the
        host once the copy has landed (_land_in_flight)."""
        states = tuple(r.state for r in verified)
        in_flight = InFlightTokens.send(tokens, states, tuple(s.num_tokens for s in states))
        self._in_flight.append(in_flight)
        self.num_in_flight_steps += 1
        row_of = {r.state.req_id: i for i, r in enumerate(verified)}
        for row in rows:
            state = row.state
            if row.first_logits_row is None:
                state.num_computed_tokens += row.num_scheduled_tokens
                continue
            state.token_ids.append(PLACEHOLDER_TOKEN_ID)
            state.num_computed_tokens = len(state.token_ids) - 1  # no drafts: nothing to roll back
            state.pending_drafts = []
        return AsyncModelRunnerOutput(
            req_ids=[r.state.req_id for r in rows],
            sampled_rows=[row_of.get(r.state.req_id) if r.first_logits_row is not None else None for r in rows],
            tokens=in_flight,
        )

    def _land_in_flight(self, keep_latest: bool) -> InFlightTokens | None:
        """Patch the placeholders of every step in flight but (optionally) the latest, waiting for their
        copies (older steps: done on the device before the latest began). Returns the one kept."""
        kept = self._in_flight[-1] if keep_latest and self._in_flight else None
        for landed in self._in_flight[: len(self._in_flight) - (kept is not None)]:
            landed.patch_states()
        self._in_flight = [] if kept is None else [kept]
        return kept

    def _verify(
        self, logits: torch.Tensor, rows: list[ScheduledRow], drafts_by_req: Mapping[str, tuple[int, ...]]
    ) -> torch.Tensor:
        """Verify every sampled request of the step in one batched pass on the logits' device: the one
        verify path for greedy and seeded rows, with or without drafts.

        Logits row j of a request decides position num_tokens + j as if drafts[:j] had been accepted
        (constraints see that history). Its target token is what spec-off decoding would emit there
        (one-hot drafts: rejection.py's module docstring), so a draft is accepted while it equals the
        target, and the target at the first unaccepted row is the recovered or bonus token."""
        params: list[RowParams] = []
        positions: list[int] = []
        masked: list[list[int]] = []
        for row in rows:
            state = row.state
            drafts = drafts_by_req[state.req_id]
            for j in range(len(drafts) + 1):
                params.append(state.params)
                positions.append(state.num_tokens + j)
                history: list[int] = []
                if state.params.bad_words_token_ids:
                    # Only the tail a banned word's prefix can match: no per-step work in the context length.
                    tail = max(len(w) for w in state.params.bad_words_token_ids) - 1
                    history = [*state.token_ids[max(0, state.num_tokens - tail) :], *drafts[:j]]
                masked.append(masked_token_ids(state.params, history, state.num_output_tokens + j))
        device = logits.device
        targets = sample_batch(logits, SamplingMetadata.build(params, positions, masked, device))

        width = max(len(drafts_by_req[r.state.req_id]) for r in rows)
        # [R, width + 1] indices of each request's logits rows, padded by repeating its first row; drafts
        # padded with -1, which never equals a target, so acceptance stops at a request's own k.
        index, drafts_padded, synthetic = [], [], []
        for row in rows:
            drafts = drafts_by_req[row.state.req_id]
            first = row.first_logits_row
            index.append([first + j if j <= len(drafts) else first for j in range(width + 1)])
            drafts_padded.append([*drafts, *[PLACEHOLDER_TOKEN_ID] * (width - len(drafts))])
            if self.synthetic_acceptance_rate is not None:
                synthetic.append(
                    synthetic_num_accepted(
                        self.synthetic_acceptance_rate, row.state.params.rng_key, row.state.num_tokens, drafts
                    )
                )
        ints = torch.tensor([*sum(index, []), *sum(drafts_padded, []), *synthetic], dtype=torch.int64)
        if device.type == "cuda":
            ints = ints.pin_memory().to(device, non_blocking=True)  # pragma: no mutate
        n = len(rows) * (width + 1)
        target_rows = targets[ints[:n].view(len(rows), width + 1)]
        if synthetic:
            accepted = ints[n + len(rows) * width :]
        else:
            matches = ints[n : n + len(rows) * width].view(len(rows), width) == target_rows[:, :width]
            accepted = torch.cumprod(matches.long(), dim=1).sum(dim=1)
        # Accepted drafts equal their targets, so a request's tokens are its targets up to and including
        # the first unaccepted row; the rest is padding.
        keep = torch.arange(width + 1, device=device)[None, :] <= accepted[:, None]
        return torch.where(keep, target_rows, PLACEHOLDER_TOKEN_ID)

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
