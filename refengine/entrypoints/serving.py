"""From a validated OpenAI request to a GenerationRequest: the rules that need the prompt length or
the vocabulary, then SamplingParams (whose ValueErrors become 400s)."""

import uuid
from dataclasses import dataclass

from refengine.entrypoints.engine_client import GenerationRequest, SamplingParams
from refengine.entrypoints.errors import APIError
from refengine.entrypoints.protocol import ChatCompletionRequest, SamplingRequest
from refengine.sampling_params import StructuredOutputsParams

# OpenAI's completions API defaults max_tokens to 16, and vLLM follows it. Chat has no such default:
# without max_tokens / max_completion_tokens it generates until the context is full (vLLM's behaviour).
DEFAULT_COMPLETION_MAX_TOKENS = 16


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


def structured_outputs_of(req: SamplingRequest) -> StructuredOutputsParams | None:
    """response_format (OpenAI) or structured_outputs (vLLM) as the engine's StructuredOutputsParams."""
    fmt = req.response_format
    if fmt is not None and fmt.type != "text" and req.structured_outputs is not None:
        raise APIError(400, "send response_format or structured_outputs, not both", param="structured_outputs")
    try:
        if (so := req.structured_outputs) is not None:
            return StructuredOutputsParams(
                json=so.json_, regex=so.regex, choice=so.choice, grammar=so.grammar, json_object=so.json_object
            )
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise APIError(
                400, 'response_format of type "json_schema" needs json_schema.schema', param="response_format"
            )
        return StructuredOutputsParams(json=fmt.json_schema.json_schema)
    except ValueError as e:
        param = "structured_outputs" if req.structured_outputs is not None else "response_format"
        raise APIError(400, str(e), param=param) from None


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
        chat = isinstance(req, ChatCompletionRequest)
        max_tokens = room if chat else min(DEFAULT_COMPLETION_MAX_TOKENS, room)
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
            structured_outputs=structured_outputs_of(req),
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


def chat_logprobs_wanted(req: ChatCompletionRequest) -> int | None:
    """Chat asks with logprobs=true plus top_logprobs=N; the engine wants just N (or None)."""
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None
