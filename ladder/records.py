"""RequestRecord: the raw facts of one streamed request, and the rule that says whether it succeeded.

All times are `time.perf_counter()` seconds. Metrics are computed from these records only.
"""

from dataclasses import dataclass, field

from ladder.spec_metrics import RequestSpec


@dataclass(slots=True)
class RequestRecord:
    concurrency: int | None  # the in-flight cap it ran under; None for an uncapped open-loop request
    phase: str  # "warmup" | "measured"
    index: int
    max_tokens: int = 0  # what the request asked for
    t_due: float = 0.0  # when a concurrency slot became free for this request
    t_send: float = 0.0  # when the request was handed to the HTTP client
    t_end: float = 0.0  # when the stream closed (or the request failed)
    chunk_times: list[float] = field(default_factory=list)  # arrival of each token-bearing chunk
    # usage.completion_tokens as of each token-bearing chunk (continuous usage); empty when the server
    # reports usage only at the end.
    chunk_usage: list[int] = field(default_factory=list)
    num_events: int = 0  # every SSE data event, including the role prelude, the usage chunk and [DONE]
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens; None: the server reports none
    done: bool = False  # [DONE] arrived
    error: str | None = None  # "kind: detail", set by the client
    prompt: list[tuple[str, str]] | None = None  # --save-text: the messages as sent, nonce included
    output_text: str | None = None  # --save-text: the content the stream carried
    token_ids: list[int] | None = None  # collected only when a list is given (ladder identity)
    silent_positions: list[int] | None = None  # ladder identity: positions of ids whose chunk had no text
    finish_reason: str | None = None  # the last one the stream carried
    request_rate: float | None = None  # the open-loop rung's rate (req/s)
    repeat: int = 0  # --repeats: which run of its rung (0-based)
    streamed: bool = True  # False: --no-stream, one JSON answer; its one "chunk" is the answer's arrival
    session: int | None = None  # --multi-turn: the session within its phase (0-based); None for a single request
    turn: int | None = None  # --multi-turn: the turn within its session (1-based)
    spec: RequestSpec | None = None  # its drafts, where the server reports them per request (spec_metrics.py)
    content_type: str | None = None  # chat, code, math (ladder.content_types); None for a single-type dataset


def failure(rec: RequestRecord, output_len: int, ignore_eos: bool, allow_chunk_count: bool) -> str | None:
    """Why `rec` failed as "kind: detail", or None for a success."""
    if rec.error is not None:
        return rec.error
    if not rec.done:
        return "truncated: the stream ended without [DONE]"
    if not rec.chunk_times:
        return "zero_tokens: no chunk carried output"
    if rec.completion_tokens is None and not allow_chunk_count:
        return "no_usage: the stream carried no usage.completion_tokens"
    n = output_tokens(rec)
    if ignore_eos and n != output_len:
        return f"length_mismatch: {n} output tokens, {output_len} requested with ignore_eos"
    if n > output_len:  # without ignore_eos a natural stop is fine, but never more than max_tokens
        return f"length_mismatch: {n} output tokens, more than max_tokens {output_len}"
    return None


def probe_failure(rec: RequestRecord) -> str | None:
    """Why a 1-token probe or canary failed, or None. Such a request only asks the server to answer and
    count: one token by usage is an answer even when no chunk carried text, as when the token is special
    and skipped from the text (a random model samples its reserved tokens)."""
    if rec.error is None and rec.done and not rec.chunk_times and rec.completion_tokens == 1:
        return None
    return failure(rec, 1, ignore_eos=True, allow_chunk_count=True)


def output_tokens(rec: RequestRecord) -> int:
    """N: the server's usage count; one token per chunk only where --allow-chunk-count allowed it."""
    return rec.completion_tokens if rec.completion_tokens is not None else len(rec.chunk_times)
