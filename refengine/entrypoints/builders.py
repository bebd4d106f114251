"""From RequestDeltas to OpenAI JSON: one builder per request, for completions or chat."""

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from refengine.entrypoints.engine_client import RequestDelta, SpecDecodingStats, Tokenizer, TokenLogprobs
from refengine.entrypoints.responses import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatMessageOut,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    PromptTokensDetails,
    ResponseModel,
    SpeculativeDecodingUsage,
    TopLogprob,
    Usage,
)
from refengine.entrypoints.serving import OutputOptions

# JSON has no -inf; OpenAI-compatible servers report impossible tokens with this floor instead.
LOGPROB_FLOOR = -9999.0


def usage_of(delta: RequestDelta) -> Usage:
    return Usage(
        prompt_tokens=delta.num_prompt_tokens,
        completion_tokens=delta.num_output_tokens,
        total_tokens=delta.num_prompt_tokens + delta.num_output_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=delta.num_cached_tokens),
        speculative_decoding=None if delta.spec_decoding_stats is None else spec_usage(delta.spec_decoding_stats),
    )


def spec_usage(stats: SpecDecodingStats) -> SpeculativeDecodingUsage:
    per_pos = stats.num_accepted_tokens_per_pos
    # Steps that accepted at least j drafts: all of them for j = 0, per_pos[j - 1] after; exact per step.
    at_least = [stats.num_drafts, *per_pos, 0]
    return SpeculativeDecodingUsage(
        num_spec_steps=stats.num_drafts,
        num_draft_tokens=stats.num_draft_tokens,
        num_accepted_draft_tokens=stats.num_accepted_tokens,
        num_spec_tokens=len(per_pos),
        mean_acceptance_length=1 + stats.num_accepted_tokens / stats.num_drafts,
        draft_acceptance_rate=stats.num_accepted_tokens / stats.num_draft_tokens,
        acceptance_histogram=[at_least[j] - at_least[j + 1] for j in range(len(per_pos) + 1)],
        num_accepted_tokens_per_pos=list(per_pos),
    )


class ResponseBuilder(ABC):
    """Turns one request's deltas into OpenAI objects; one instance per request."""

    def __init__(self, request_id: str, model: str, tokenizer: Tokenizer, options: OutputOptions) -> None:
        self.request_id = request_id
        self.model = model
        self.tokenizer = tokenizer
        self.options = options
        self.created = int(time.time())

    def _object(self, cls: Callable[..., ResponseModel], choices: list, usage: Usage | None) -> ResponseModel:
        """An OpenAI object of this request (its id, creation time and model) with `choices` and `usage`."""
        return cls(id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage)

    def token_text(self, token_id: int) -> str:
        if self.options.tokens_as_ids:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id])

    def prelude(self, num_prompt_tokens: int) -> list[ResponseModel]:
        """Chunks streamed before any output (chat sends the assistant role first)."""
        return []

    @abstractmethod
    def chunk(self, delta: RequestDelta) -> ResponseModel | None:
        """The streamed chunk for one delta, or None when it carries nothing to show."""

    @abstractmethod
    def usage_chunk(self, last: RequestDelta) -> ResponseModel:
        """The final streamed chunk, with no choices and the request's usage."""

    @abstractmethod
    def response(self, deltas: Sequence[RequestDelta]) -> ResponseModel:
        """The whole (non-streamed) response."""

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
        return self._object(CompletionResponse, [choice], self.chunk_usage(delta))

    def usage_chunk(self, last: RequestDelta) -> ResponseModel:
        return self._object(CompletionResponse, [], usage_of(last))

    def response(self, deltas: Sequence[RequestDelta]) -> ResponseModel:
        entries = _joined_logprobs(deltas)
        choice = self._choice(
            "".join(d.text for d in deltas),
            [t for d in deltas for t in d.token_ids],
            entries,
            deltas[-1].finish_reason,
        )
        return self._object(CompletionResponse, [choice], usage_of(deltas[-1]))


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

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None) -> ResponseModel:
        return self._object(ChatCompletionChunk, choices, usage)

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
        return self._object(ChatCompletionResponse, [choice], usage_of(deltas[-1]))


def _joined_logprobs(deltas: Sequence[RequestDelta]) -> list[TokenLogprobs] | None:
    if all(d.logprobs is None for d in deltas):
        return None
    return [entry for d in deltas for entry in d.logprobs or ()]
