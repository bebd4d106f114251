"""OpenAI response bodies: whole responses, streamed chunks, errors and the model list."""

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer


class ResponseModel(BaseModel):
    """OpenAI keeps core nullable fields as explicit nulls (finish_reason) but leaves optional
    extensions out; fields named in `omit_when_none` are dropped from the JSON when they are None."""

    omit_when_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_unset_extensions(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for key in self.omit_when_none:
            if data.get(key) is None:
                data.pop(key, None)
        return data


class ErrorInfo(ResponseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(ResponseModel):
    error: ErrorInfo


class PromptTokensDetails(ResponseModel):
    cached_tokens: int


class SpeculativeDecodingUsage(ResponseModel):
    """One request's drafts and acceptances, named as vLLM's per-request speculative-decoding metrics
    (vllm#48915), which AIPerf reads (aiperf#1191). A spec step is one verification of a draft."""

    num_spec_steps: int
    num_draft_tokens: int
    num_accepted_draft_tokens: int
    num_spec_tokens: int  # the longest draft it verified (k)
    mean_acceptance_length: float  # 1 + accepted / steps: tokens each verification emitted
    draft_acceptance_rate: float  # accepted / drafted
    acceptance_histogram: list[int]  # [j] = steps that accepted exactly j draft tokens
    # [i] = steps whose draft token at position i was accepted (vLLM's /metrics counter, per request).
    num_accepted_tokens_per_pos: list[int]


class Usage(ResponseModel):
    omit_when_none = frozenset({"prompt_tokens_details", "speculative_decoding"})

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # OpenAI's field: how many prompt tokens the prefix cache served.
    prompt_tokens_details: PromptTokensDetails | None = None
    # On a finished request that verified drafts; absent otherwise (spec off, or before the end).
    speculative_decoding: SpeculativeDecodingUsage | None = None


class CompletionLogprobs(ResponseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(ResponseModel):
    omit_when_none = frozenset({"token_ids"})
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class CompletionResponse(ResponseModel):
    omit_when_none = frozenset({"usage"})
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(ResponseModel):
    content: list[ChatTokenLogprob]


class ChatMessageOut(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(ResponseModel):
    omit_when_none = frozenset({"token_ids"})
    index: int = 0
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(ResponseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(ResponseModel):
    omit_when_none = frozenset({"role", "content"})
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(ResponseModel):
    omit_when_none = frozenset({"token_ids"})
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(ResponseModel):
    omit_when_none = frozenset({"usage"})
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "refengine"
    root: str
    max_model_len: int


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
