"""The server's view of the engine: AsyncLLM's surface (docs/contracts.md) as Protocols.

The boundary types are the engine's own (refengine.engine.outputs), re-exported here so that the
server imports everything engine-facing from one place. The Protocols say exactly what the server
relies on, so a test double can stand in for AsyncLLM without importing torch.
"""

from collections.abc import AsyncGenerator, Sequence
from typing import Protocol

from refengine.engine.outputs import (
    EngineDeadError,
    EngineInfo,
    EngineStats,
    GenerationRequest,
    RequestDelta,
    RequestFailedError,
    SpecDecodingStats,
    TokenLogprobs,
)
from refengine.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = [
    "EngineClient",
    "EngineDeadError",
    "EngineInfo",
    "EngineStats",
    "GenerationRequest",
    "Message",
    "RequestDelta",
    "RequestFailedError",
    "SpecDecodingStats",
    "SamplingParams",
    "TokenLogprobs",
    "Tokenizer",
]


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

    async def reset_prefix_cache(self) -> bool: ...

    def validate_structured_outputs(self, params: StructuredOutputsParams) -> None:
        """Raises ValueError naming why the constraint cannot be compiled (or the backend is missing)."""
        ...

    def shutdown(self) -> None: ...
