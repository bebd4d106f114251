"""The boundary objects: SchedulerOutput goes to the runner, ModelRunnerOutput comes back, and
EngineCoreOutputs goes on to the engine."""

from dataclasses import dataclass, field

from refengine.request import FinishReason
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.metrics import SpecDecodingStats

# structured_output's, re-exported: the runner takes it with the step's other boundary objects from here.
from refengine.structured_output.output import GrammarOutput as GrammarOutput


@dataclass(frozen=True, slots=True)
class NewRequestData:
    """A request the runner holds no state for: its first admission, or its return after a
    preemption (then output_token_ids is non-empty and the KV is recomputed from position 0)."""

    req_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    sampling_params: SamplingParams
    rng_key: int
    eos_token_id: int | None
    block_ids: tuple[int, ...]
    num_computed_tokens: int  # position of the first token scheduled this step


@dataclass(frozen=True, slots=True)
class CachedRequestData:
    """A request the runner already holds: scheduled before and not preempted since."""

    req_id: str
    # Position of the first token scheduled this step. Under async scheduling it assumes every
    # draft in flight is accepted; the runner corrects it with the acceptance it already knows.
    num_computed_tokens: int
    block_ids: tuple[int, ...]  # all of the request's blocks, not only the new ones


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    scheduled_new_reqs: tuple[NewRequestData, ...]
    scheduled_cached_reqs: tuple[CachedRequestData, ...]
    # Tokens per request this step: prompt chunk, or 1 + drafts for a decode.
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Drafts to verify, only for requests that have some: real ids (sync) or -1 placeholders that the
    # runner fills from its own drafts (async). update_draft_token_ids_in_output may rewrite them.
    scheduled_spec_decode_tokens: dict[str, list[int]]
    num_spec_tokens_to_schedule: int
    # Trailing -1 pads per request, written by update_draft_token_ids_in_output.
    num_invalid_spec_tokens: dict[str, int]
    # Requests whose runner state must be dropped before this step (finished, aborted, preempted).
    finished_req_ids: frozenset[str]
    preempted_req_ids: frozenset[str]
    # A scheduled request with a constraint (bad_words, a grammar) still has output in flight, or (a
    # grammar) drafts that are still -1 placeholders: its drafts can only be validated, and its masks
    # computed, after that output is applied and the runner's drafts are known, so the engine defers
    # sampling this step.
    pending_constrained_output: bool


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """The log-probability of an emitted token under the model's raw output distribution, and the
    `top` most likely tokens with theirs."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step as one request saw it: where its drafts began (the position of the first
    draft), the drafts it verified and how many were accepted. The oracle compares these between sync
    and async arms position by position (identical tokens can hide a drafter fed the wrong state)."""

    position: int
    draft_token_ids: tuple[int, ...]
    num_accepted: int


@dataclass(frozen=True, slots=True)
class ModelRunnerOutput:
    """One row per scheduled request: accepted drafts then one recovered-or-bonus token, or an empty
    list for a prefill chunk that does not reach the end of the known tokens. `logprobs` holds one entry
    per emitted token, for the requests that asked for them."""

    req_ids: list[str]
    sampled_token_ids: list[list[int]]
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EngineCoreOutput:
    req_id: str
    new_token_ids: tuple[int, ...]  # already trimmed after a stop
    finish_reason: FinishReason | None
    stop_reason: int | str | None  # the stop token id or stop string, when finish_reason is STOP
    logprobs: tuple[TokenLogprobs, ...] | None = None  # one per new token, when the request asked
    num_cached_tokens: int = 0  # prompt tokens its first admission found in the prefix cache (vLLM's)
    # The request's own drafts and acceptances, on its finishing output only (None: no draft verified);
    # the server reports them in usage (vLLM's per-request speculative-decoding metrics).
    spec_decoding_stats: SpecDecodingStats | None = None


@dataclass(frozen=True, slots=True)
class EngineCoreOutputs:
    outputs: tuple[EngineCoreOutput, ...]
    finished_req_ids: frozenset[str]
    spec_decoding_stats: SpecDecodingStats | None  # this step's drafts only; None without drafts
