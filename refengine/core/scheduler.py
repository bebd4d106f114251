"""Scheduler: the token-budget policy (admission, chunked prefill, drafts, preemption) and the
bookkeeping that applies each step's output to the requests.

Invariant numbers refer to docs/invariants.md.
"""

import dataclasses
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from refengine.config import EngineConfig
from refengine.core.kv_cache_manager import KVCacheManager
from refengine.core.outputs import (
    CachedRequestData,
    EngineCoreOutput,
    EngineCoreOutputs,
    GrammarOutput,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from refengine.core.stop import StopChecker, check_stop
from refengine.request import Request, RequestStatus
from refengine.spec_decode.adaptive_verification import AdaptiveVerification, survival
from refengine.spec_decode.metrics import SpecDecodingStats

if TYPE_CHECKING:
    from refengine.structured_output.manager import StructuredOutputManager


class SchedulerInvariantError(RuntimeError):
    """The scheduler's counters contradict an engine invariant (numbered as in docs/invariants.md)."""


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        *,
        stop_checker: StopChecker | None = None,
        structured_output_manager: "StructuredOutputManager | None" = None,
        verify_policy: AdaptiveVerification | None = None,
    ) -> None:
        config.validate()
        if config.async_scheduling != self.async_scheduling():
            raise ValueError(
                f"EngineConfig.async_scheduling={config.async_scheduling} needs "
                f"{'AsyncScheduler' if config.async_scheduling else 'Scheduler'}, not {type(self).__name__}"
            )
        self.config = config
        self.kv_cache_manager = KVCacheManager(
            config.num_blocks, config.block_size, enable_caching=config.enable_prefix_caching
        )
        self.num_spec_tokens = config.num_speculative_tokens
        self.num_lookahead_tokens = config.num_lookahead_tokens
        self.stop_checker = stop_checker
        # Owns the grammars (torch-free); None: this engine refuses structured output.
        self.structured_output_manager = structured_output_manager
        # Drafts a grammar forbade, cut before verification (as vLLM's validate_tokens does).
        self.num_grammar_cut_drafts = 0
        # Requests that finished without running (a grammar that did not compile), reported with the
        # next step's outputs.
        self._unscheduled_finishes: list[EngineCoreOutput] = []
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the newest is preempted first
        self.finished_req_ids: set[str] = set()  # finished since the last schedule()
        self.num_preemptions = 0
        self.spec_decoding_stats = SpecDecodingStats()  # since start
        # Adaptive verification: how many of its drafts each request verifies per step (None: all of them).
        if verify_policy is not None and verify_policy.k != self.num_spec_tokens:
            raise ValueError(f"a verify-cost table for k={verify_policy.k} in an engine of k={self.num_spec_tokens}")
        self.verify_policy = verify_policy

    def async_scheduling(self) -> bool:
        return False

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        if request.num_prompt_tokens >= self.config.max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: prompt of {request.num_prompt_tokens} tokens leaves no room "
                f"to generate within max_model_len={self.config.max_model_len}"
            )
        if request.sampling_params.stop and self.stop_checker is None:
            raise ValueError(
                f"request {request.request_id!r} has stop strings but the scheduler has no stop_checker"
            )
        if request.status != RequestStatus.WAITING:
            raise ValueError(f"request {request.request_id!r} is {request.status.name}, not WAITING")
        if (constraint := request.sampling_params.structured_outputs) is not None:
            if self.structured_output_manager is None:
                raise ValueError(f"request {request.request_id!r} asks for structured output, which this engine lacks")
            request.structured_output_request = self.structured_output_manager.request(constraint)
            request.status = RequestStatus.WAITING_FOR_FSM
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(self, req_ids: Iterable[str], status: RequestStatus) -> None:
        """Finish requests from outside (abort, or a stop the engine found); unknown ids are ignored,
        since a request may have finished on its own in the meantime."""
        if not status.is_finished():
            raise ValueError(f"finish_requests needs a finished status, got {status.name}")
        for req_id in req_ids:
            if (request := self.requests.get(req_id)) is not None:
                self._finish_request(request, status)

    def wait_for_grammar(self, timeout: float) -> bool:
        """When nothing could be scheduled: blocks until the oldest grammar still compiling is done (at most
        `timeout` seconds), so that the engine waits instead of spinning on empty steps. False if no
        request waits for its grammar."""
        pending = next((r for r in self.waiting if r.status == RequestStatus.WAITING_FOR_FSM), None)
        if pending is None:
            return False
        pending.structured_output_request.wait(timeout)
        return True

    def has_requests(self) -> bool:
        """Unfinished requests, or finished ones the runner has not been told about yet."""
        return bool(self.requests or self.finished_req_ids)

    def schedule(self) -> SchedulerOutput:
        # NOTE: there are no prefill or decode phases. A request knows how many of its tokens have KV
        # (num_computed_tokens) and how many it should have: its prompt and outputs, plus the drafts to
        # verify (plus, under async, the outputs still in flight). Each step hands out the token budget
        # so that the first number catches up with the second; a prompt longer than the budget is just
        # a request that catches up over several steps (chunked prefill), and a decode is 1 + drafts.
        # Running requests go first, oldest first; new ones are admitted only if nobody was preempted.
        if self.verify_policy is not None:
            self._choose_num_drafts(self.verify_policy)
        budget = self.config.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        spec_tokens: dict[str, list[int]] = {}
        scheduled: list[tuple[Request, bool]] = []  # (request, runner already holds it)
        preempted: list[Request] = []

        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = self._num_new_tokens(request, budget)
            if num_new == 0:
                i += 1
                continue
            while self.kv_cache_manager.allocate_slots(request, num_new, self.num_lookahead_tokens) is None:
                victim = self.running.pop()
                self._preempt_request(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if request.status != RequestStatus.RUNNING:
                break  # it preempted itself: nothing behind it can fit either
            self._take(request, num_new, num_scheduled, spec_tokens)
            scheduled.append((request, True))
            budget -= num_new
            i += 1

        skipped: list[Request] = []
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.popleft()
            if request.status == RequestStatus.WAITING_FOR_FSM:
                if not request.structured_output_request.is_ready():
                    # Its grammar still compiles off this thread: the batch goes on without it.
                    skipped.append(request)
                    continue
                if (error := request.structured_output_request.compile_error) is not None:
                    # Fails alone: aborted with the reason, the batch untouched.
                    request.stop_reason = error
                    self._finish_request(request, RequestStatus.FINISHED_ABORTED)
                    self._unscheduled_finishes.append(
                        EngineCoreOutput(request.request_id, (), RequestStatus.FINISHED_ABORTED.finish_reason, error)
                    )
                    continue
                request.status = RequestStatus.WAITING
            if request.num_stale_output_tokens > 0:
                # Invariant 9: while frames from before its preemption are in flight, resuming would
                # re-sample positions they are about to deliver (test_no_readmission_while_stale).
                # NOTE: skipping it lets later requests pass it, a deliberate break from strict FCFS.
                skipped.append(request)
                continue
            # A new or resumed request holds no blocks: it starts after its cached prefix, if any.
            hit_blocks, num_hit = self.kv_cache_manager.get_computed_blocks(request)
            # Invariant 44: the last token's logits are always computed, so a hit stops before it
            # (test_a_whole_prompt_hit_still_computes_its_last_token).
            if num_hit >= request.num_tokens:
                raise SchedulerInvariantError(f"{request}: a cache hit of {num_hit} tokens leaves nothing to compute")
            request.num_computed_tokens = num_hit
            num_new = self._num_new_tokens(request, budget)
            if (
                self.kv_cache_manager.allocate_slots(request, num_new, self.num_lookahead_tokens, hit_blocks)
                is None
            ):
                request.num_computed_tokens = 0
                self.waiting.appendleft(request)
                break
            self.kv_cache_manager.record_admission(request, num_hit)
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit  # reported in usage: the first admission's hit
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self._take(request, num_new, num_scheduled, spec_tokens)
            scheduled.append((request, False))
            budget -= num_new
        self.waiting.extendleft(reversed(skipped))

        total = sum(num_scheduled.values())
        # Invariant: the step respects its limits (test_property_sync_random_workloads).
        if total > self.config.max_num_batched_tokens or len(self.running) > self.config.max_num_seqs:
            raise SchedulerInvariantError(
                f"scheduled {total} tokens for {len(self.running)} running requests, limits are "
                f"{self.config.max_num_batched_tokens} and {self.config.max_num_seqs}"
            )
        output = SchedulerOutput(
            scheduled_new_reqs=tuple(self._new_request_data(r) for r, cached in scheduled if not cached),
            scheduled_cached_reqs=tuple(
                CachedRequestData(
                    r.request_id, r.num_computed_tokens, self.kv_cache_manager.get_block_ids(r.request_id)
                )
                for r, cached in scheduled
                if cached
            ),
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=total,
            scheduled_spec_decode_tokens=spec_tokens,
            num_spec_tokens_to_schedule=self.num_spec_tokens,
            num_invalid_spec_tokens={},
            finished_req_ids=frozenset(self.finished_req_ids),
            preempted_req_ids=frozenset(r.request_id for r in preempted),
            pending_constrained_output=any(
                r.has_constraint
                and (
                    r.num_output_placeholders > 0
                    # Async drafts are -1 placeholders until the runner's are filled in; a grammar's
                    # masks need them (invariant 25).
                    or (self.async_scheduling() and r.structured_output_request is not None and r.request_id in spec_tokens)
                )
                for r, _ in scheduled
            ),
        )
        self.finished_req_ids.clear()
        self._update_after_schedule(output)
        return output

    def _choose_num_drafts(self, policy: AdaptiveVerification) -> None:
        """Adaptive verification: cut each running request's drafts (under async, its -1 placeholders) to
        the K the policy chooses from their survival by position and the step's verify cost."""
        holding = [r for r in self.running if r.spec_token_ids]
        if not holding:
            return
        k = self.num_spec_tokens
        survivals = {
            r.request_id: survival(r.spec_decoding_stats, self.spec_decoding_stats, k)[: len(r.spec_token_ids)]
            for r in holding
        }
        chosen = policy.choose(len(self.running), survivals)
        for request in holding:
            num = chosen[request.request_id]
            # Invariant 60: a request verifies 0..k drafts, never more than it holds
            # (test_adaptive_k_is_honoured_and_never_exceeds_k).
            if not 0 <= num <= min(k, len(request.spec_token_ids)):
                raise SchedulerInvariantError(f"{request}: {num} drafts chosen of {request.spec_token_ids}, k={k}")
            del request.spec_token_ids[num:]
            policy.num_chosen[num] += 1

    def _num_new_tokens(self, request: Request, budget: int) -> int:
        # Invariant 2: catch up with tokens + drafts + placeholders, within the budget, and never compute
        # the position of max_model_len's last token, which is sampled but never fed back.
        num_new = request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
        threshold = self.config.long_prefill_token_threshold
        if threshold and request.num_computed_tokens < request.num_prompt_tokens:
            # A long prompt takes several steps, so other requests are admitted beside it (chunked prefill).
            num_new = min(num_new, threshold)
        return max(0, min(num_new, budget, self.config.max_model_len - 1 - request.num_computed_tokens))

    def _take(self, request: Request, num_new: int, num_scheduled: dict, spec_tokens: dict) -> None:
        num_scheduled[request.request_id] = num_new
        # Positions past the known tokens and placeholders are draft positions.
        num_drafts = (
            request.num_computed_tokens + num_new - request.num_tokens - request.num_output_placeholders
        )
        if num_drafts > 0:
            # Invariant 2: the draft list matches the draft slots exactly (test_budget_caps_drafts).
            if num_drafts > len(request.spec_token_ids):
                raise SchedulerInvariantError(
                    f"{request}: {num_drafts} draft slots for {request.spec_token_ids}"
                )
            spec_tokens[request.request_id] = request.spec_token_ids[:num_drafts]

    def _new_request_data(self, request: Request) -> NewRequestData:
        return NewRequestData(
            req_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            output_token_ids=request.output_token_ids,
            sampling_params=request.sampling_params,
            rng_key=request.rng_key,
            eos_token_id=request.eos_token_id,
            block_ids=self.kv_cache_manager.get_block_ids(request.request_id),
            num_computed_tokens=request.num_computed_tokens,
        )

    def _update_after_schedule(self, output: SchedulerOutput) -> None:
        for req_id, num_new in output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            # Invariant 1: advance at schedule time, so the next schedule() never repeats these positions
            # (test_stop_by_max_tokens_schedules_no_extra_step).
            request.num_computed_tokens += num_new
            request.num_in_flight_tokens += num_new
            request.is_prefill_chunk = request.num_computed_tokens < (
                request.num_tokens + request.num_output_placeholders
            )
            # Invariant 3: scheduling consumes the drafts (test_preemption_clears_drafts).
            request.spec_token_ids = []

    def _preempt_request(self, request: Request) -> None:
        # Invariant 9: recompute from scratch; output of frames already in flight becomes stale and is
        # counted in tokens, the unit it drains in (test_preempt_marks_all_inflight_output_stale). A
        # running request has no stale output left: it was not re-admitted until that drained.
        if request.num_stale_output_tokens != 0:
            raise SchedulerInvariantError(f"{request}: preempted while stale output is in flight")
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_output_placeholders = 0
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> EngineCoreOutputs:
        rows = dict(zip(runner_output.req_ids, runner_output.sampled_token_ids, strict=True))
        # Invariant: one row per scheduled request, so a frame is never half applied.
        if rows.keys() != scheduler_output.num_scheduled_tokens.keys():
            raise SchedulerInvariantError(
                f"runner rows {sorted(rows)} != scheduled {sorted(scheduler_output.num_scheduled_tokens)}"
            )
        step_stats = SpecDecodingStats()
        outputs, self._unscheduled_finishes = self._unscheduled_finishes, []
        for req_id, num_scheduled in scheduler_output.num_scheduled_tokens.items():
            request = self.requests.get(req_id)
            if request is None:
                continue  # finished or aborted while this frame was in flight
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(req_id, [])
            num_invalid = scheduler_output.num_invalid_spec_tokens.get(req_id, 0)
            out = self._update_request(request, num_scheduled, drafts, num_invalid, rows[req_id], step_stats)
            if out is not None:
                if req_id in runner_output.logprobs:
                    # The same trim as the tokens: nothing after a stop is reported.
                    logprobs = tuple(runner_output.logprobs[req_id][: len(out.new_token_ids)])
                    out = dataclasses.replace(out, logprobs=logprobs)
                outputs.append(out)
        return EngineCoreOutputs(
            outputs=tuple(outputs),
            finished_req_ids=frozenset(o.req_id for o in outputs if o.finish_reason is not None),
            spec_decoding_stats=step_stats if step_stats.num_drafts else None,
        )

    def _update_request(
        self,
        request: Request,
        num_scheduled: int,
        drafts: list[int],
        num_invalid: int,
        generated: list[int],
        step_stats: SpecDecodingStats,
    ) -> EngineCoreOutput | None:
        # Invariant 11: every returning frame releases its in-flight share first (test_property_async_*).
        request.num_in_flight_tokens -= num_scheduled
        stale = request.num_stale_output_tokens > 0
        if stale:
            request.num_stale_output_tokens -= num_scheduled
        if request.num_in_flight_tokens < 0 or request.num_stale_output_tokens < 0:
            raise SchedulerInvariantError(f"{request}: in-flight counters went negative")
        if len(generated) > len(drafts) + 1 or any(t < 0 for t in generated):
            raise SchedulerInvariantError(f"{request}: row {generated} for drafts {drafts}")
        if not stale:
            num_rejected = 0
            if drafts and generated:
                num_accepted = len(generated) - 1
                num_rejected = len(drafts) - num_accepted
                # Invariant 5: rejected positions are computed again next step (test_rejection_rollback).
                request.num_computed_tokens -= num_rejected
                num_draft_tokens = len(drafts) - num_invalid
                # Invariant 13: a -1 pad is never accepted (test_update_draft_token_ids_in_output_*).
                if num_accepted > num_draft_tokens:
                    raise SchedulerInvariantError(
                        f"{request}: accepted {num_accepted} of {num_draft_tokens} drafts"
                    )
                if num_draft_tokens > 0:
                    for stats in (step_stats, self.spec_decoding_stats, request.spec_decoding_stats):
                        stats.observe_draft(num_draft_tokens, num_accepted)
            self._release_placeholders(request, num_rejected + len(generated))

        kept, finish_status = self._append_output(request, generated)
        if finish_status is not None and not stale:
            # Invariant 6: positions after the stop never count as computed (test_stop_trims_*).
            request.num_computed_tokens -= len(generated) - len(kept)
        if not stale:
            # Invariant 41: publish by the corrected count: positions of frames still in flight are
            # placeholders (async), rejected drafts are rolled back above, so every token of a published
            # block is committed (test_blocks_are_published_only_when_committed).
            self.kv_cache_manager.cache_blocks(
                request, request.num_computed_tokens - request.num_output_placeholders
            )
        if finish_status is not None:
            self._finish_request(request, finish_status)
        elif generated and not stale:
            # Invariant 4: a decoding request's KV covers everything but its last token, plus the
            # positions of outputs still in flight (test_placeholder_arithmetic_over_acceptance).
            if request.num_computed_tokens - request.num_output_placeholders != request.num_tokens - 1:
                raise SchedulerInvariantError(f"{request}: nc - ph != nt - 1 after an update")
        if not kept and finish_status is None:
            return None
        return EngineCoreOutput(
            req_id=request.request_id,
            new_token_ids=tuple(kept),
            finish_reason=None if finish_status is None else finish_status.finish_reason,
            stop_reason=request.stop_reason,
            num_cached_tokens=max(request.num_cached_tokens, 0),
            spec_decoding_stats=(request.spec_decoding_stats.copy()
                                 if finish_status is not None and request.spec_decoding_stats.num_drafts else None),
        )

    def _release_placeholders(self, request: Request, num_tokens: int) -> None:
        """Sync scheduling makes no placeholders; AsyncScheduler overrides this."""

    def _append_output(
        self, request: Request, generated: list[int]
    ) -> tuple[list[int], RequestStatus | None]:
        """Append one token at a time, checking for a stop after each; tokens after a stop are dropped.
        A grammar advances by exactly these committed tokens, and its end is a stop."""
        structured = request.structured_output_request
        for i, token_id in enumerate(generated):
            request.append_output_token_ids(token_id)
            if structured is not None:
                self._advance_grammar(request, token_id)
                if structured.grammar.is_terminated():
                    return generated[: i + 1], RequestStatus.FINISHED_STOPPED
            if (
                status := check_stop(request, token_id, self.config.max_model_len, self.stop_checker)
            ) is not None:
                return generated[: i + 1], status
        return generated, None

    def _advance_grammar(self, request: Request, token_id: int) -> None:
        grammar = request.structured_output_request.grammar
        # Invariant 25: a committed token is one the row's mask allowed, and the matcher holds exactly the
        # committed output (every tentative advance through drafts was rolled back).
        if not grammar.accept_tokens([token_id]):
            raise SchedulerInvariantError(f"{request}: emitted token {token_id} that its grammar forbids ({grammar.error})")
        if grammar.num_processed_tokens != request.num_output_tokens:
            raise SchedulerInvariantError(
                f"{request}: its grammar consumed {grammar.num_processed_tokens} tokens for "
                f"{request.num_output_tokens} outputs"
            )

    def _valid_grammar_prefix(self, request: Request, drafts: list[int]) -> int:
        """How many leading drafts the request's grammar allows from its committed output; the rest is
        cut before verification (invariant 25) and counted."""
        if request.structured_output_request is None or not drafts:
            return len(drafts)
        num_valid = request.structured_output_request.grammar.validate_tokens(drafts)
        self.num_grammar_cut_drafts += len(drafts) - num_valid
        return num_valid

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        """The step's token bitmasks, from the grammars' committed state and the step's drafts. Under
        async scheduling, called for a deferred step only after the previous output is applied."""
        if self.structured_output_manager is None:
            return None
        # Rows for the scheduled requests with a grammar that sample this step (a prefill chunk does not).
        structured = {}
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is not None and request.structured_output_request is not None and not request.is_prefill_chunk:
                structured[req_id] = request.structured_output_request
        return self.structured_output_manager.grammar_bitmask(structured, scheduler_output.scheduled_spec_decode_tokens)

    def _finish_request(self, request: Request, status: RequestStatus) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request in self.waiting:  # not when it is finished straight out of the queue
            self.waiting.remove(request)
        request.status = status
        self.kv_cache_manager.free(request)
        if self.verify_policy is not None:
            self.verify_policy.forget(request.request_id)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)

    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None:
        """Sync scheduling: store the drafts the runner proposed after the step just applied."""
        for req_id, drafts in draft_token_ids.items():
            request = self.requests.get(req_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue
            if len(drafts) > self.num_spec_tokens:
                raise SchedulerInvariantError(f"{len(drafts)} drafts for {req_id}, k={self.num_spec_tokens}")
            # Invariant 8: drafts after a non-final prefill chunk would sit at prompt positions
            # (test_chunked_prefill_discards_drafts).
            request.spec_token_ids = [] if request.is_prefill_chunk else list(drafts)
            del request.spec_token_ids[self._valid_grammar_prefix(request, request.spec_token_ids) :]
