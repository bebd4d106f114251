"""ModelRunner: builds the step's inputs from a SchedulerOutput, runs the model and verifies/samples.

State lives in `requests`, keyed by request id (invariant 17), and in the persistent InputBatch,
whose rows are found by id too and change only as the SchedulerOutputs say (input_batch.py): a step
with the same requests as the last one writes only the tokens and blocks it adds.

A step is split in two, as in vLLM: `execute_model` runs the forward and keeps the logits;
`sample_tokens` verifies drafts and samples. The engine's deferred branch runs other work between
the two (it applies the previous frame's output and validates drafts against constraints).

Invariant numbers refer to docs/invariants.md.
"""

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from refengine.core.outputs import GrammarOutput, ModelRunnerOutput, SchedulerOutput, TokenLogprobs
from refengine.distributed.parallel_state import TPGroup
from refengine.model.device import on_device, to_device
from refengine.model.kv_cache import KVCache
from refengine.model.transformer import ModelOutput, Transformer
from refengine.sample.rejection_sampler import (
    PLACEHOLDER_TOKEN_ID,
    SpecDecodeMetadata,
    accept_matching_prefix,
    draft_row_masks,
    rejection_sample,
)
from refengine.spec_decode.proposer import DraftInput, PaddedDraftBatch, Proposer
from refengine.worker.async_output import AsyncModelRunnerOutput, InFlightTokens
from refengine.worker.cuda_graphs import CudaGraphs
from refengine.worker.errors import RunnerInvariantError
from refengine.worker.input_batch import InputBatch
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


@dataclass(frozen=True, slots=True)
class ScheduledRow:
    """One request's slice of the step."""

    state: CachedRequestState
    batch_row: int  # its row in the InputBatch (rows move only between steps)
    num_computed_tokens: int  # exact position of the first token fed this step
    num_scheduled_tokens: int
    first_row: int  # where its rows start in the flat token batch
    draft_ids: tuple[int, ...]  # the drafts fed, after filling -1 placeholders
    first_logits_row: int | None  # None: a prefill chunk that does not reach the last known token


class StepAcceptRule(Protocol):
    """A rule that replaces verification's acceptance for speed studies (synthetic_acceptance.py): it
    sees the step's rows, so that it draws from the host's facts without waiting for the device."""

    def __call__(
        self,
        drafts: torch.Tensor,
        targets: torch.Tensor,
        rows: Sequence["ScheduledRow"],
        drafts_by_req: Mapping[str, tuple[int, ...]],
    ) -> torch.Tensor:
        """[R] accepted drafts of each row, from its [R, width] drafts (padded with -1) and the targets at
        their positions, on their device."""
        ...


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
        input_batch: InputBatch,
        *,
        drafter: Proposer | None = None,
        cuda_graphs: CudaGraphs | None = None,
        accept: StepAcceptRule | None = None,
        tp_group: TPGroup | None = None,
    ) -> None:
        self.model = model
        # Tensor parallelism: this rank's group (None: one rank, nothing to agree on).
        self.tp_group = tp_group
        # Inputs are built on the host; on a GPU they travel from pinned memory, non-blocking.
        self.device = kv_cache.layers[0].key.device if kv_cache.layers else torch.device("cpu")
        self.cuda_graphs = cuda_graphs
        # How drafts are accepted: verification (None), unless a speed study swaps in synthetic_acceptance.py's.
        self.accept = accept
        self.num_graph_steps = 0
        self.num_eager_steps = 0
        self.drafter = drafter
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.requests: dict[str, CachedRequestState] = {}
        self.input_batch = input_batch
        self.num_steps = 0
        self._executed: ExecutedBatch | None = None
        # Steps whose sampled ids are still on their way to the host, oldest first (at most two).
        self._in_flight: list[InFlightTokens] = []
        # Launches that found the previous step's sampled ids not yet landed: the GPU overlap witness.
        self.num_overlapped_launches = 0
        # Steps whose ids went in flight, and input ids gathered on the device: the path ran.
        self.num_in_flight_steps = 0
        self.num_gathered_inputs = 0
        # Steps whose sampled ids sample_tokens read back to the host, waiting for the device: those
        # with drafts, logprobs or bad words: one per such step, with a padded drafter's drafts in the same
        # copy. A host drafter's own reads are its num_readbacks.
        self.num_readback_steps = 0

    # ---- state -------------------------------------------------------------------------------
    def _update_states(self, so: SchedulerOutput) -> None:
        """Apply the step's membership to the requests and their batch rows: the only place rows are
        added, removed or moved."""
        gone = so.finished_req_ids | so.preempted_req_ids
        for req_id in gone:
            self.requests.pop(req_id, None)
            self.input_batch.remove_request(req_id)
        if self.drafter is not None and gone:
            self.drafter.remove(gone)
        for new in so.scheduled_new_reqs:
            state = CachedRequestState.from_new(new)
            self.input_batch.add_request(state)
            self.requests[new.req_id] = state
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
            self.input_batch.block_table.extend(self.input_batch.req_id_to_index[cached.req_id], cached.block_ids)

    # ---- execute -----------------------------------------------------------------------------
    def execute_model(self, so: SchedulerOutput) -> None:
        # Streams, events and graph replays go to the thread's current device: make it the model's.
        with on_device(self.device):
            self._execute_model(so)

    def _execute_model(self, so: SchedulerOutput) -> None:
        if self._executed is not None:
            raise RunnerInvariantError("execute_model called twice without sample_tokens in between")
        self.num_steps += 1
        # Land older frames first: their ids go into the rows of requests still held, and a request
        # that left meanwhile gets a fresh row from the scheduler's tokens below.
        latest = self._land_in_flight(keep_latest=True)
        self._update_states(so)
        latest_row = {} if latest is None else {s.req_id: r for r, s in enumerate(latest.states)}
        gather_at: list[int] = []  # flat input positions filled on the device ...
        gather_from: list[int] = []  # ... from these rows of the latest step's sampled ids

        rows: list[ScheduledRow] = []
        sample_rows: list[int] = []
        num_fed = 0
        for req_id, num_scheduled in so.num_scheduled_tokens.items():
            state = self.requests[req_id]
            batch_row = self.input_batch.req_id_to_index[req_id]
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
                offset = num_fed + num_known - 1
                sample_rows.extend(range(offset, offset + len(drafts) + 1))
            elif drafts:
                raise RunnerInvariantError(f"request {req_id!r}: drafts scheduled behind a prefill chunk")
            last = start + num_known - 1
            if state.token_ids[last] == PLACEHOLDER_TOKEN_ID:
                # Invariant 19: only the last sampled token may still be in flight, from the latest step.
                if req_id not in latest_row or PLACEHOLDER_TOKEN_ID in state.token_ids[start:last]:
                    raise RunnerInvariantError(f"request {req_id!r}: an input token in flight outside the latest step")
                gather_at.append(num_fed + num_known - 1)
                gather_from.append(latest_row[req_id])
            if drafts:
                # A placeholder the runner has no draft for is fed as token 0 and verified as -1: rejected.
                self.input_batch.write_tokens(batch_row, start + num_known, [max(d, 0) for d in drafts])
            rows.append(ScheduledRow(state, batch_row, start, num_scheduled, num_fed, drafts, first_logits_row))
            num_fed += num_scheduled

        if not rows:
            self._executed = ExecutedBatch((), torch.empty(0), None)
            return
        num_scheduled = [r.num_scheduled_tokens for r in rows]
        ids_t, positions_t, meta = self.input_batch.prepare_inputs(
            [r.batch_row for r in rows], [r.num_computed_tokens for r in rows], num_scheduled
        )
        sample_t = torch.from_numpy(np.asarray(sample_rows, dtype=np.int64))
        capture_layers = () if self.drafter is None else self.drafter.capture_layers
        gather = self._input_gather(latest, gather_at, gather_from)
        if latest is not None and not latest.is_ready():
            self.num_overlapped_launches += 1
        with torch.inference_mode():
            if (
                self.cuda_graphs is not None
                and len(sample_rows) == num_fed  # every row sampled, in order  # pragma: no mutate
                and self.cuda_graphs.can_run(num_scheduled, meta, capture_layers)  # pragma: no mutate
            ):
                # CUDA graphs exist only on a GPU: CPU mutation testing cannot reach this branch.
                # pragma: no mutate block
                out, logits = self.cuda_graphs.run(ids_t, positions_t, meta, num_scheduled[0], gather)
                self.num_graph_steps += 1
            else:
                ids_t, positions_t, sample_t = (to_device(t, self.device) for t in (ids_t, positions_t, sample_t))
                meta = to_device(meta, self.device)
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
        index = to_device(torch.tensor(at + rows, dtype=torch.int64), self.device)
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
        self,
        draft_overrides: Mapping[str, list[int]] | None = None,
        grammar_output: GrammarOutput | None = None,
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        """Verify and sample the executed step. `draft_overrides` replaces the drafts a request is
        verified against (the deferred constraint branch pads invalid drafts with -1, which always
        reject); the model was fed the original drafts, so only a prefix of them can be accepted.
        `grammar_output` holds the token bitmasks of the structured-output requests' rows.

        In the common path (no drafts, no logprobs, no bad words) the sampled ids stay on the device and
        the output comes back in flight: nothing here waits for the device. Otherwise the ids are read
        back here, because the drafter, the logprobs or the next bad-words mask need them on the host."""
        with on_device(self.device):
            return self._sample_tokens(draft_overrides, grammar_output)

    def _sample_tokens(
        self, draft_overrides: Mapping[str, list[int]] | None, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
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
        tokens = self._verify(executed.logits, verified, drafts_by_req, grammar_output) if verified else None
        if tokens is not None and self.tp_group is not None:
            # Invariant 45: every rank goes on with the same ids (rank 0's), whatever its own logits said.
            tokens = self.tp_group.broadcast_sampled(tokens)
        in_flight = (
            tokens is not None
            and tokens.shape[1] == 1
            and self.drafter is None
            and all(r.state.num_logprobs is None and not r.state.params.bad_words_token_ids for r in verified)
        )
        if in_flight:
            return self._send_in_flight(executed.rows, verified, tokens)
        drafting = self.drafter is not None and executed.model_output is not None
        drafts = None  # the drafter's device drafts, one row per verified request
        if drafting:
            with torch.inference_mode():
                drafts = self.drafter.propose(self._padded_draft_batch(executed, verified, tokens))
        token_rows, draft_rows = ([], []) if tokens is None else self._read_back(tokens, drafts)
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
            self._append_tokens(row, tokens_of_row)
            # Every fed token up to the last accepted draft now has committed KV; the last sampled token
            # is the next step's input.
            state.num_computed_tokens = state.num_tokens - 1
            state.pending_drafts = []
            sampled.append(tokens_of_row)
            num_accepted = len(tokens_of_row) - 1
            draft_inputs.append(self._draft_input(row, row.num_scheduled_tokens - k + num_accepted, propose=True))
        if drafting:
            with torch.inference_mode():
                proposals = self.drafter.commit(draft_inputs, None if drafts is None else draft_rows)
            for req_id, proposed in proposals.items():
                self.requests[req_id].pending_drafts = list(proposed)
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled, logprobs=logprobs)

    def _padded_draft_batch(
        self, executed: ExecutedBatch, verified: list[ScheduledRow], tokens: torch.Tensor | None
    ) -> PaddedDraftBatch:
        """Every fed row of the step for the drafter, before the host knows what was accepted. A row's
        input is the token after it: known on the host up to the last known token, then the verified
        ids gathered on the device (a rejected row gets its masked -1 as 0: any valid id will do).
        `tokens` is None for a step of prefill chunks only, which verifies nothing."""
        if tokens is None:
            tokens = torch.zeros(0, 1, dtype=torch.long, device=self.device)
        ids: list[int] = []
        at: list[int] = []  # flat rows whose next token is a verified id ...
        source: list[int] = []  # ... at this flat index of `tokens`
        num_drafts: list[int] = []
        width = tokens.shape[1]
        verified_index = {r.state.req_id: i for i, r in enumerate(verified)}
        for row in executed.rows:
            start, token_ids = row.num_computed_tokens, row.state.token_ids
            if row.first_logits_row is None:
                ids += token_ids[start + 1 : start + row.num_scheduled_tokens + 1]
                continue
            k = len(row.draft_ids)
            num_known = row.num_scheduled_tokens - k
            ids += token_ids[start + 1 : start + num_known]
            at += range(len(ids), len(ids) + k + 1)
            v = verified_index[row.state.req_id]
            source += range(v * width, v * width + k + 1)
            ids += [0] * (k + 1)
            num_drafts.append(k)
        host = to_device(torch.tensor(ids + at + source + num_drafts, dtype=torch.int64), self.device)
        n, m = len(ids), len(at)
        verified_ids = tokens.reshape(-1)[host[n + m : n + 2 * m]].clamp(min=0)
        input_ids = host[:n].index_copy(0, host[n : n + m], verified_ids)
        # vLLM's num_rejected_tokens: a request's fed drafts less the accepted ones (its valid ids - 1).
        num_accepted = (tokens != PLACEHOLDER_TOKEN_ID).sum(dim=1) - 1
        num_rejected = host[n + 2 * m :] - num_accepted
        model_output = executed.model_output
        return PaddedDraftBatch(
            tuple(self._draft_input(r, r.num_scheduled_tokens, propose=r.first_logits_row is not None) for r in executed.rows),
            input_ids,
            num_rejected,
            model_output.hidden_states,
            model_output.aux_hidden_states,
        )

    def _read_back(
        self, tokens: torch.Tensor, drafts: torch.Tensor | None
    ) -> tuple[list[list[int]], list[list[int]]]:
        """The step's one wait for the device: its verified ids (each row's valid prefix: the accepted
        drafts and the recovered or bonus token) and, with a padded drafter, its drafts, in one copy."""
        self.num_readback_steps += 1
        width = tokens.shape[1]
        if drafts is None:
            rows = tokens.tolist()
        else:
            # Invariant 30: a padded drafter proposes one row per verified request, in the same order.
            if drafts.shape[0] != tokens.shape[0]:
                raise RunnerInvariantError(f"{drafts.shape[0]} rows of drafts for {tokens.shape[0]} verified requests")
            rows = torch.cat([tokens, drafts], dim=1).tolist()
        token_rows = [[t for t in row[:width] if t != PLACEHOLDER_TOKEN_ID] for row in rows]
        return token_rows, [row[width:] for row in rows]

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
            self._append_tokens(row, [PLACEHOLDER_TOKEN_ID])
            state.num_computed_tokens = len(state.token_ids) - 1  # no drafts: nothing to roll back
            state.pending_drafts = []
        return AsyncModelRunnerOutput(
            req_ids=[r.state.req_id for r in rows],
            sampled_rows=[row_of.get(r.state.req_id) if r.first_logits_row is not None else None for r in rows],
            tokens=in_flight,
        )

    def _append_tokens(self, row: ScheduledRow, token_ids: list[int]) -> None:
        """A request's new tokens (or a -1 for one in flight), in its history and in its batch row."""
        self.input_batch.write_tokens(row.batch_row, row.state.num_tokens, token_ids)
        row.state.token_ids += token_ids

    def _land_in_flight(self, keep_latest: bool) -> InFlightTokens | None:
        """Patch the placeholders of every step in flight but (optionally) the latest, waiting for their
        copies (older steps: done on the device before the latest began), in the requests' histories
        and in the rows of those still held. Returns the one kept."""
        kept = self._in_flight[-1] if keep_latest and self._in_flight else None
        for landed in self._in_flight[: len(self._in_flight) - (kept is not None)]:
            for state, first, token_ids in landed.patches():
                state.token_ids[first : first + len(token_ids)] = token_ids
                if self.requests.get(state.req_id) is state:
                    self.input_batch.write_tokens(self.input_batch.req_id_to_index[state.req_id], first, token_ids)
        self._in_flight = [] if kept is None else [kept]
        return kept

    def _verify(
        self,
        logits: torch.Tensor,
        rows: list[ScheduledRow],
        drafts_by_req: Mapping[str, tuple[int, ...]],
        grammar_output: GrammarOutput | None = None,
    ) -> torch.Tensor:
        """Verify every sampled request of the step in one pass of the batched rejection sampler on the
        logits' device: the one verify path for greedy and seeded rows, with or without drafts.

        Logits row j of a request decides position num_tokens + j as if drafts[:j] had been accepted
        (constraints see that history)."""
        batch_rows: list[int] = []
        positions: list[int] = []
        masked: list[tuple[int, int]] = []  # (logits row, token) pairs the constraints forbid
        for row in rows:
            state = row.state
            drafts = drafts_by_req[state.req_id]
            first = len(positions)
            batch_rows += [row.batch_row] * (len(drafts) + 1)
            positions += range(state.num_tokens, state.num_tokens + len(drafts) + 1)
            pairs = draft_row_masks(state.params, state.token_ids, drafts, state.num_output_tokens)
            masked += ((first + j, token) for j, token in pairs)
        device = logits.device
        bitmask_rows, bitmask = self._grammar_rows(rows, drafts_by_req, grammar_output)
        metadata = self.input_batch.sampling_metadata(batch_rows, positions, masked, device, bitmask_rows, bitmask)
        spec = SpecDecodeMetadata.build(
            [drafts_by_req[r.state.req_id] for r in rows], [r.first_logits_row for r in rows], device
        )
        accept = (
            accept_matching_prefix
            if self.accept is None
            else functools.partial(self.accept, rows=rows, drafts_by_req=drafts_by_req)
        )
        return rejection_sample(logits, metadata, spec, accept)

    @staticmethod
    def _grammar_rows(
        rows: list[ScheduledRow], drafts_by_req: Mapping[str, tuple[int, ...]], grammar_output: GrammarOutput | None
    ) -> tuple[list[int], np.ndarray | None]:
        """The logits rows a grammar constrains, and their bitmasks in the same order: a request's bitmask
        row j (the grammar advanced through drafts[:j]) masks its logits row j, which decides draft j or,
        past the drafts, the bonus token."""
        if grammar_output is None:
            return [], None
        unknown = grammar_output.rows.keys() - {row.state.req_id for row in rows}
        if unknown:
            raise RunnerInvariantError(f"grammar rows for requests this step does not verify: {sorted(unknown)}")
        logits_rows: list[int] = []
        bitmask_rows: list[int] = []
        for row in rows:
            span = grammar_output.rows.get(row.state.req_id)
            if span is None:
                continue
            first, count = span
            # Invariant 25: one bitmask per verified row of the request, drafts then bonus.
            if count != len(drafts_by_req[row.state.req_id]) + 1:
                raise RunnerInvariantError(
                    f"request {row.state.req_id!r}: {count} grammar rows for {len(drafts_by_req[row.state.req_id])} drafts"
                )
            logits_rows += range(row.first_logits_row, row.first_logits_row + count)
            bitmask_rows += range(first, first + count)
        return logits_rows, np.ascontiguousarray(grammar_output.grammar_bitmask[bitmask_rows])

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
            context_start=row.state.num_cached_tokens,
        )

    def executed_rows(self) -> tuple[ScheduledRow, ...]:
        """The rows of the step executed and not yet sampled (none between steps)."""
        return () if self._executed is None else self._executed.rows

    def take_draft_token_ids(self) -> dict[str, list[int]]:
        """Sync scheduling only: the drafts proposed after this step, for the scheduler to schedule."""
        return {req_id: list(s.pending_drafts) for req_id, s in self.requests.items() if s.pending_drafts}
