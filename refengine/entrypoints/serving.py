"""From a validated OpenAI request to a GenerationRequest, and from RequestDeltas back to OpenAI JSON.

Nothing here does I/O; app.py drives the engine and the HTTP connection.
"""

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from refengine.entrypoints.engine_client import (
    GenerationRequest,
    RequestDelta,
    SamplingParams,
    Tokenizer,
    TokenLogprobs,
)
from refengine.entrypoints.errors import APIError
from refengine.entrypoints.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatMessageOut,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    ResponseModel,
    SamplingRequest,
    TopLogprob,
    Usage,
)

# JSON has no -inf; OpenAI-compatible servers report impossible tokens with this floor instead.
LOGPROB_FLOOR = -9999.0


@dataclass(frozen=True)
class OutputOptions:
    stream: bool
    include_usage: bool  # a final usage chunk when streaming (always present when not streaming)
    continuous_usage: bool  # usage so far on every streamed chunk
    tokens_as_ids: bool  # logprob tokens spelled "token_id:<id>" (vLLM's return_tokens_as_token_ids)
    return_token_ids: bool  # choices carry the raw token ids (vLLM's return_token_ids)


@dataclass(frozen=True)
class PreparedRequest:
    generation: GenerationRequest
    options: OutputOptions


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def prepare(
    req: SamplingRequest,
    request_id: str,
    prompt_token_ids: list[int],
    *,
    max_model_len: int,
    vocab_size: int,
    logprobs: int | None,
) -> PreparedRequest:
    """The rules that need the prompt length or the vocabulary, then SamplingParams."""
    prompt_param = "messages" if isinstance(req, ChatCompletionRequest) else "prompt"
    if not prompt_token_ids:
        raise APIError(400, "the prompt is empty after tokenization", param=prompt_param)
    if max(prompt_token_ids) >= vocab_size:
        raise APIError(
            400, f"prompt token ids must be below the vocabulary size {vocab_size}", param="prompt"
        )
    if req.stop_token_ids and max(req.stop_token_ids) >= vocab_size:
        raise APIError(
            400, f"stop_token_ids must be below the vocabulary size {vocab_size}", param="stop_token_ids"
        )
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")

    max_tokens, param = req.max_tokens, "max_tokens"
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        if max_tokens is not None and max_tokens != req.max_completion_tokens:
            raise APIError(
                400, "max_tokens and max_completion_tokens disagree; send one", param="max_completion_tokens"
            )
        max_tokens, param = req.max_completion_tokens, "max_completion_tokens"
    num_prompt = len(prompt_token_ids)
    room = max_model_len - num_prompt
    if room < 1:
        raise APIError(
            400,
            f"the prompt is {num_prompt} tokens, which leaves no room under max_model_len={max_model_len}",
            param=prompt_param,
        )
    if max_tokens is None:
        max_tokens = room  # as vLLM does: generate until the context is full
    elif max_tokens > room:
        raise APIError(
            400,
            f"prompt ({num_prompt} tokens) + {param} ({max_tokens}) exceeds max_model_len={max_model_len}",
            param=param,
        )
    min_tokens = req.min_tokens or 0
    if min_tokens > max_tokens:
        raise APIError(
            400, f"min_tokens ({min_tokens}) exceeds max_tokens ({max_tokens})", param="min_tokens"
        )

    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=max(req.top_k or 0, 0),
            seed=req.seed,
            stop=req.stop_strings,
            stop_token_ids=list(req.stop_token_ids or ()),
            ignore_eos=bool(req.ignore_eos),
            min_tokens=min_tokens,
            bad_words=list(req.bad_words or ()),
        )
    except ValueError as e:
        # SamplingParams messages start with "SamplingParams.<field> ..."; the field becomes `param`.
        message = str(e)
        field = message.split(maxsplit=1)[0].removeprefix("SamplingParams.") if message else ""
        raise APIError(400, message, param=field if field in SamplingRequest.model_fields else None) from None

    stream = bool(req.stream)
    options = req.stream_options
    return PreparedRequest(
        generation=GenerationRequest(request_id, prompt_token_ids, params, logprobs),
        options=OutputOptions(
            stream=stream,
            include_usage=stream and options is not None and bool(options.include_usage),
            continuous_usage=stream and options is not None and bool(options.continuous_usage_stats),
            tokens_as_ids=bool(req.return_tokens_as_token_ids),
            return_token_ids=bool(req.return_token_ids),
        ),
    )


def usage_of(delta: RequestDelta) -> Usage:
    return Usage(
        prompt_tokens=delta.num_prompt_tokens,
        completion_tokens=delta.num_output_tokens,
        total_tokens=delta.num_prompt_tokens + delta.num_output_tokens,
    )


class ResponseBuilder:
    """Turns one request's deltas into OpenAI objects; one instance per request."""

    def __init__(self, request_id: str, model: str, tokenizer: Tokenizer, options: OutputOptions) -> None:
        self.request_id = request_id
        self.model = model
        self.tokenizer = tokenizer
        self.options = options
        self.created = int(time.time())

    def token_text(self, token_id: int) -> str:
        if self.options.tokens_as_ids:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id])

    def prelude(self, num_prompt_tokens: int) -> list[ResponseModel]:
        return []

    def chunk(self, delta: RequestDelta) -> ResponseModel | None:
        raise NotImplementedError

    def usage_chunk(self, last: RequestDelta) -> ResponseModel:
        raise NotImplementedError

    def response(self, deltas: Sequence[RequestDelta]) -> ResponseModel:
        raise NotImplementedError

    def wants_chunk(self, delta: RequestDelta) -> bool:
        """Skip deltas that carry nothing a client can see (text held back at a UTF-8 boundary)."""
        return (
            bool(delta.text) or delta.finished or delta.logprobs is not None or self.options.return_token_ids
        )

    def chunk_usage(self, delta: RequestDelta) -> Usage | None:
        return usage_of(delta) if self.options.continuous_usage else None

    def token_ids(self, token_ids: list[int]) -> list[int] | None:
        return token_ids if self.options.return_token_ids else None


class CompletionBuilder(ResponseBuilder):
    def __init__(self, request_id: str, model: str, tokenizer: Tokenizer, options: OutputOptions) -> None:
        super().__init__(request_id, model, tokenizer, options)
        self.text_offset = 0  # characters of output text before the next logprob entry

    def logprobs(self, entries: list[TokenLogprobs] | None) -> CompletionLogprobs | None:
        if entries is None:
            return None
        tokens, offsets = [], []
        for entry in entries:
            token = self.token_text(entry.token_id)
            tokens.append(token)
            offsets.append(self.text_offset)
            self.text_offset += len(self.tokenizer.decode([entry.token_id]))
        tops = [{self.token_text(t): max(lp, LOGPROB_FLOOR) for t, lp in e.top} for e in entries]
        return CompletionLogprobs(
            tokens=tokens,
            token_logprobs=[max(e.logprob, LOGPROB_FLOOR) for e in entries],
            top_logprobs=tops if any(e.top for e in entries) else None,
            text_offset=offsets,
        )

    def _choice(
        self, text: str, token_ids: list[int], entries: list[TokenLogprobs] | None, finish: str | None
    ):
        return CompletionChoice(
            text=text,
            logprobs=self.logprobs(entries),
            finish_reason=finish,
            token_ids=self.token_ids(token_ids),
        )

    def chunk(self, delta: RequestDelta) -> ResponseModel | None:
        if not self.wants_chunk(delta):
            return None
        choice = self._choice(delta.text, delta.token_ids, delta.logprobs, delta.finish_reason)
        return CompletionResponse(
            id=self.request_id,
            created=self.created,
            model=self.model,
            choices=[choice],
            usage=self.chunk_usage(delta),
        )

    def usage_chunk(self, last: RequestDelta) -> ResponseModel:
        return CompletionResponse(
            id=self.request_id, created=self.created, model=self.model, choices=[], usage=usage_of(last)
        )

    def response(self, deltas: Sequence[RequestDelta]) -> ResponseModel:
        entries = _joined_logprobs(deltas)
        choice = self._choice(
            "".join(d.text for d in deltas),
            [t for d in deltas for t in d.token_ids],
            entries,
            deltas[-1].finish_reason,
        )
        return CompletionResponse(
            id=self.request_id,
            created=self.created,
            model=self.model,
            choices=[choice],
            usage=usage_of(deltas[-1]),
        )


class ChatBuilder(ResponseBuilder):
    def logprobs(self, entries: list[TokenLogprobs] | None) -> ChatLogprobs | None:
        if entries is None:
            return None
        content = []
        for entry in entries:
            token = self.token_text(entry.token_id)
            tops = [self._top(t, lp) for t, lp in entry.top]
            content.append(
                ChatTokenLogprob(
                    token=token,
                    logprob=max(entry.logprob, LOGPROB_FLOOR),
                    bytes=list(token.encode()),
                    top_logprobs=tops,
                )
            )
        return ChatLogprobs(content=content)

    def _top(self, token_id: int, logprob: float) -> TopLogprob:
        token = self.token_text(token_id)
        return TopLogprob(token=token, logprob=max(logprob, LOGPROB_FLOOR), bytes=list(token.encode()))

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def prelude(self, num_prompt_tokens: int) -> list[ResponseModel]:
        # The role arrives alone first, as OpenAI does; benchmark clients skip it when timing TTFT.
        usage = Usage(prompt_tokens=num_prompt_tokens, completion_tokens=0, total_tokens=num_prompt_tokens)
        choice = ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))
        return [self._chunk([choice], usage if self.options.continuous_usage else None)]

    def chunk(self, delta: RequestDelta) -> ResponseModel | None:
        if not self.wants_chunk(delta):
            return None
        choice = ChatChunkChoice(
            delta=ChatDelta(content=delta.text),
            logprobs=self.logprobs(delta.logprobs),
            finish_reason=delta.finish_reason,
            token_ids=self.token_ids(delta.token_ids),
        )
        return self._chunk([choice], self.chunk_usage(delta))

    def usage_chunk(self, last: RequestDelta) -> ResponseModel:
        return self._chunk([], usage_of(last))

    def response(self, deltas: Sequence[RequestDelta]) -> ResponseModel:
        choice = ChatChoice(
            message=ChatMessageOut(content="".join(d.text for d in deltas)),
            logprobs=self.logprobs(_joined_logprobs(deltas)),
            finish_reason=deltas[-1].finish_reason,
            token_ids=self.token_ids([t for d in deltas for t in d.token_ids]),
        )
        return ChatCompletionResponse(
            id=self.request_id,
            created=self.created,
            model=self.model,
            choices=[choice],
            usage=usage_of(deltas[-1]),
        )


def _joined_logprobs(deltas: Sequence[RequestDelta]) -> list[TokenLogprobs] | None:
    if all(d.logprobs is None for d in deltas):
        return None
    return [entry for d in deltas for entry in d.logprobs or ()]


def chat_logprobs_wanted(req: ChatCompletionRequest) -> int | None:
    """Chat asks with logprobs=true plus top_logprobs=N; the engine wants just N (or None)."""
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None
