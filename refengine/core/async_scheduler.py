"""AsyncScheduler: plans step n+1 while step n is still running, so the scheduler works with output
placeholders (tokens known to be coming) instead of the tokens themselves.

Invariant numbers refer to docs/invariants.md.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING

from refengine.config import EngineConfig
from refengine.core.outputs import SchedulerOutput
from refengine.core.scheduler import Scheduler, SchedulerInvariantError
from refengine.core.stop import StopChecker
from refengine.request import Request
from refengine.sample.bad_words import banned_next_tokens
from refengine.spec_decode.adaptive_verification import AdaptiveVerification

if TYPE_CHECKING:
    from refengine.structured_output.manager import StructuredOutputManager

# Returns how many leading drafts are valid for the request given its committed output (bad_words in
# this engine). It only sees drafts up to the first negative id.
DraftValidator = Callable[[Request, list[int]], int]


def valid_draft_prefix(request: Request, drafts: list[int]) -> int:
    """The engine's DraftValidator: how many leading drafts survive the request's bad_words, given its
    committed history, by the rule the sampler masks with (as a grammar's validate_tokens would)."""
    history = list(request.all_token_ids)
    for j, draft in enumerate(drafts):
        if draft in banned_next_tokens(history, request.sampling_params.bad_words_token_ids):
            return j
        history.append(draft)
    return len(drafts)


class AsyncScheduler(Scheduler):
    def __init__(
        self,
        config: EngineConfig,
        *,
        stop_checker: StopChecker | None = None,
        draft_validator: DraftValidator | None = None,
        structured_output_manager: "StructuredOutputManager | None" = None,
        verify_policy: AdaptiveVerification | None = None,
    ) -> None:
        super().__init__(
            config, stop_checker=stop_checker, structured_output_manager=structured_output_manager,
            verify_policy=verify_policy,
        )
        self.draft_validator = draft_validator

    def async_scheduling(self) -> bool:
        return True

    def _num_new_tokens(self, request: Request, budget: int) -> int:
        # Invariant 7: the frame in flight delivers at least one token even if it rejects every draft;
        # if that one token reaches max_tokens, another step would only be trimmed away
        # (test_stop_by_max_tokens_schedules_no_extra_step).
        ph = request.num_output_placeholders
        max_tokens = request.sampling_params.max_tokens
        if ph > 0 and request.num_computed_tokens + 2 - ph >= request.num_prompt_tokens + max_tokens:
            return 0
        return super()._num_new_tokens(request, budget)

    def _update_after_schedule(self, output: SchedulerOutput) -> None:
        super()._update_after_schedule(output)
        for req_id in output.num_scheduled_tokens:
            request = self.requests[req_id]
            if request.is_prefill_chunk:
                continue  # Invariant 3: a chunk samples nothing, so it gets no placeholders
            num_drafts = len(output.scheduled_spec_decode_tokens.get(req_id, ()))
            # Invariant 4: this frame will deliver 1 + num_drafts tokens at most; the placeholders hold
            # their positions until it returns (test_placeholder_arithmetic_over_acceptance).
            request.num_output_placeholders += 1 + num_drafts
            # Invariant 3: the runner proposes the next drafts itself; the scheduler reserves their slots.
            request.spec_token_ids = [-1] * output.num_spec_tokens_to_schedule

    def _release_placeholders(self, request: Request, num_tokens: int) -> None:
        # Invariant 4: a returning frame gives back what it took, 1 + drafts = rejected + returned.
        request.num_output_placeholders -= num_tokens
        if request.num_output_placeholders < 0:
            raise SchedulerInvariantError(f"{request}: output placeholders went negative")

    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None:
        # Invariant 15: real ids would overwrite the placeholders one step late
        # (test_async_scheduler_ships_only_placeholders).
        raise SchedulerInvariantError(
            "async scheduling keeps -1 placeholders; drafts reach it only via update_draft_token_ids_in_output"
        )

    def update_draft_token_ids_in_output(
        self, draft_token_ids: dict[str, list[int]], scheduler_output: SchedulerOutput
    ) -> None:
        """Put real drafts into a deferred step's placeholders (invariant 12): cut to the scheduled
        count, keep the valid prefix, pad with -1 back to the scheduled count, and record the pads.
        A scheduled request missing from draft_token_ids keeps its -1s, all of them counted invalid."""
        scheduled = scheduler_output.scheduled_spec_decode_tokens
        for req_id, placeholders in scheduled.items():
            request = self.requests.get(req_id)
            if request is None:
                continue
            num_slots = len(placeholders)
            drafts = list(draft_token_ids.get(req_id, ()))[:num_slots]
            num_valid = next((i for i, t in enumerate(drafts) if t < 0), len(drafts))
            if request.has_constraint and self.draft_validator is not None:
                num_valid_drafts = self.draft_validator(request, drafts[:num_valid])
                if not 0 <= num_valid_drafts <= num_valid:
                    raise SchedulerInvariantError(f"draft_validator kept {num_valid_drafts} of {num_valid}")
                num_valid = num_valid_drafts
            num_valid = self._valid_grammar_prefix(request, drafts[:num_valid])
            # Invariant 12: the scheduled count never changes; -1 is always rejected by the sampler.
            scheduled[req_id] = drafts[:num_valid] + [-1] * (num_slots - num_valid)
            if num_valid < num_slots:
                scheduler_output.num_invalid_spec_tokens[req_id] = num_slots - num_valid
