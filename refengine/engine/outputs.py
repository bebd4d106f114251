"""What the engine hands to its callers."""

from dataclasses import dataclass, field
from typing import Literal

from refengine.core.outputs import StepRecord, TokenLogprobs
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.metrics import SpecDecodingStats

__all__ = ["SpecDecodingStats", "StepRecord", "TokenLogprobs"]


@dataclass(frozen=True)
class RequestDelta:
    """New output of one request from one engine step; several tokens when drafts were accepted.
    `text` is complete UTF-8 only, and never holds any part of a stop string."""

    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprobs] | None
    finished: bool
    finish_reason: Literal["stop", "length", "abort"] | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    spec_decoding_stats: SpecDecodingStats | None = None  # the request's drafts, on its finishing delta


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    logprobs: int | None = None  # top logprobs wanted per token; 0 = the chosen token's only; None = none


@dataclass(frozen=True)
class EngineInfo:
    """How the engine was configured; servers report it so that benchmark tables can compare like
    with like."""

    numerics: str
    dtype: str
    weight_format: str
    spec_method: str | None
    num_speculative_tokens: int
    async_scheduling: bool
    async_scheduling_source: str
    max_num_seqs: int
    block_size: int
    num_blocks: int
    device: str = "cpu"
    enable_prefix_caching: bool = True


@dataclass(frozen=True)
class EngineStats:
    num_requests_running: int
    num_requests_waiting: int
    num_prompt_tokens: int  # counters from here on: totals since start
    num_generation_tokens: int
    num_preemptions: int
    num_free_blocks: int
    num_blocks: int
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    drafter_random_init: bool = False
    num_grammar_cut_drafts: int = 0  # drafts a grammar forbade, cut before verification
    # Prefix cache, in tokens as vLLM counts them: admissions' tokens looked up, and found cached.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_prefix_cache_evictions: int = 0  # cached blocks handed out again for new content

    @property
    def kv_cache_usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0


class EngineDeadError(RuntimeError):
    """Raised by generate() and by in-flight iterators once the engine loop has died."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RequestFailedError(RuntimeError):
    """Raised by generate() when one request failed while the engine stayed alive (it could not be
    added, say); only that request is lost."""

    def __init__(self, request_id: str, reason: str) -> None:
        super().__init__(f"request {request_id} failed: {reason}")
        self.request_id = request_id
        self.reason = reason


@dataclass(slots=True)
class RequestOutput:
    """A finished request, as LLM.generate returns it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    steps: list[StepRecord] = field(default_factory=list)
