"""The server's view of the engine: the AsyncLLM contract of docs/contracts.md, as types.

NOTE: refengine/engine/async_llm.py is being written alongside the server. Until it lands, the
boundary types are declared here exactly as the contract states them, so the server and its test
double agree on one definition; when it lands this module re-exports its types and keeps only the
Protocols, which say what the server relies on.
"""

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from refengine.sampling_params import SamplingParams

FinishReason = Literal["stop", "length", "abort"]


class EngineDeadError(RuntimeError):
    """Raised by generate() and by in-flight iterators once the engine loop has died."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    logprobs: int | None  # number of top logprobs wanted; 0 = only the chosen token's; None = none


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(frozen=True)
class RequestDelta:
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprobs] | None
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int


@dataclass(frozen=True)
class EngineInfo:
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

    @property
    def kv_cache_usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0


class Message(Protocol):
    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str: ...


class Tokenizer(Protocol):
    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...

    def apply_chat_template(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
        """The conversation rendered as text, ending with the assistant generation prompt."""
        ...


class EngineClient(Protocol):
    """What the server needs from AsyncLLM; tests pass a fake with the same surface."""

    tokenizer: Tokenizer
    model_name: str
    max_model_len: int
    engine_info: EngineInfo

    @property
    def dead_reason(self) -> str | None: ...

    def generate(self, request: GenerationRequest) -> AsyncGenerator[RequestDelta, None]: ...

    def stats(self) -> EngineStats: ...

    def shutdown(self) -> None: ...
