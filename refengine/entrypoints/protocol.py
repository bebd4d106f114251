"""OpenAI request bodies, validated strictly.

Requests are parsed with `model_validate_json` in strict mode, so JSON types must match exactly
("5" is not an int, 1.0 is not an int, "true" is not a bool). Unknown fields are ignored, as OpenAI
and vLLM do, except the ones that would change sampling: those are listed here and refused unless
they carry their no-op value, so a client is never silently given different semantics.
Cross-field rules that need the prompt length or the tokenizer live in serving.py.
"""

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
MAX_LOGPROBS = 20  # vLLM's default cap; OpenAI's own is 5 (completions) / 20 (chat)
MAX_STOP_STRINGS = 32
MAX_STOP_STRING_CHARS = 1024

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class RequestModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class StreamOptions(RequestModel):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class JsonSchemaFormat(RequestModel):
    """OpenAI's response_format.json_schema. The grammar is always enforced, so `strict` is accepted
    either way."""

    name: str | None = None
    description: str | None = None
    # `schema` would shadow a BaseModel attribute; the JSON key is still "schema".
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(BaseModel):
    """vLLM's structured_outputs field: exactly one constraint. Unknown keys are refused, since a
    constraint the server ignored would silently leave the output free."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    json_: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class SamplingRequest(RequestModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: FiniteFloat | None = Field(None, ge=0.0, le=2.0)
    top_p: FiniteFloat | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)  # -1 and 0 both mean off (vLLM)
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0, le=INT32_MAX)]] | None = Field(None, max_length=1024)
    bad_words: list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS)]] | None = Field(
        None, max_length=MAX_STOP_STRINGS
    )
    n: int | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(None, ge=0)
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    user: str | None = None
    # Seconds the request may take, from its arrival to its last token; the server's --request-timeout
    # caps it. Past it the request is aborted (its KV freed) and the client gets an error.
    timeout: FiniteFloat | None = Field(None, gt=0.0)
    # Accepted only at their no-op value (see the module docstring).
    presence_penalty: FiniteFloat | None = None
    frequency_penalty: FiniteFloat | None = None
    repetition_penalty: FiniteFloat | None = None
    min_p: FiniteFloat | None = None
    best_of: int | None = None
    use_beam_search: bool | None = None
    logit_bias: dict[str, Any] | None = None
    # Structured output: OpenAI's response_format, or vLLM's structured_outputs (one of the two).
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    # vLLM's older spellings of structured_outputs: refused, so that they are never silently ignored.
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None

    @field_validator("guided_json", "guided_regex", "guided_choice", "guided_grammar")
    @classmethod
    def _no_guided_fields(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("is not supported by this server; send structured_outputs instead")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _check_stop(cls, value: Any) -> Any:
        # Checked by hand because a str | list[str] union reports one error per union member.
        items = [value] if isinstance(value, str) else value
        if value is None:
            return None
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise ValueError("must be a string or a list of strings")
        if len(items) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if any(not s or len(s) > MAX_STOP_STRING_CHARS for s in items):
            raise ValueError(f"stop strings must be 1 to {MAX_STOP_STRING_CHARS} characters long")
        return value

    @field_validator("n")
    @classmethod
    def _check_n(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("only n=1 is supported")
        return value

    @field_validator("presence_penalty", "frequency_penalty", "min_p")
    @classmethod
    def _zero_only(cls, value: float | None) -> float | None:
        if value not in (None, 0.0):
            raise ValueError("is not supported by this server (only 0 is accepted)")
        return value

    @field_validator("repetition_penalty")
    @classmethod
    def _one_only(cls, value: float | None) -> float | None:
        if value not in (None, 1.0):
            raise ValueError("is not supported by this server (only 1 is accepted)")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_one(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("is not supported by this server (only 1 is accepted)")
        return value

    @field_validator("use_beam_search")
    @classmethod
    def _no_beam_search(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("beam search is not supported by this server")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value:
            raise ValueError("is not supported by this server")
        return value

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(SamplingRequest):
    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        """One prompt per request: a string or token ids, possibly wrapped in a one-element list."""
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
            value = value[0]
        if isinstance(value, str):
            if not value:
                raise ValueError("is empty")
            return value
        if (
            isinstance(value, list)
            and value
            and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
        ):
            if any(t < 0 for t in value):
                raise ValueError("token ids must be non-negative")
            return value
        if isinstance(value, list) and len(value) > 1 and all(isinstance(p, str | list) for p in value):
            raise ValueError("batched prompts are not supported; send one prompt per request")
        if isinstance(value, list) and not value:
            raise ValueError("is empty")
        raise ValueError("must be a non-empty string or a list of token ids")

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("is not supported by this server")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError("is not supported by this server")
        return value


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, value: Any) -> Any:
        """Content may be a list of {"type": "text", "text": ...} parts; they are joined by newlines."""
        if not isinstance(value, list):
            return value
        texts = []
        for part in value:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise ValueError(
                    'content parts must be {"type": "text", "text": <string>}; only text is supported'
                )
            texts.append(part["text"])
        if not texts:
            raise ValueError("is empty")
        return "\n".join(texts)


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Any] | None = None
    tool_choice: Any = None

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("tool calling is not supported by this server")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, value: Any) -> Any:
        if value not in (None, "none"):
            raise ValueError("tool calling is not supported by this server")
        return value


def lone_surrogate(raw: bytes) -> str | None:
    """The first unpaired UTF-16 surrogate escape (such as \\ud800) in a JSON body, spelled as sent.

    JSON grammar allows such escapes, but they name no Unicode character, so no text can hold them;
    the strict parser reports only "unexpected end of hex escape". The lenient standard parser tells
    the two apart. Called on the error path only."""
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON at all, or nested deeper than Python recurses
        return None
    pending = [document]  # walked without recursion: the body may nest as deep as json.loads allows
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            found = next((c for c in value if "\ud800" <= c <= "\udfff"), None)
            if found is not None:
                return f"\\u{ord(found):04x}"
        elif isinstance(value, dict):
            pending.extend([*value.keys(), *value.values()])
        elif isinstance(value, list):
            pending.extend(value)
    return None
