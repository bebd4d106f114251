"""Timed trace replay (`--dataset trace:FILE`) in Mooncake's JSONL format, as AIPerf and guidellm replay it:
one request per line, `{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}`.

Each hash id stands for one block of BLOCK_TOKENS prompt tokens: equal ids give equal blocks in every request
that names them, so the trace's prefix sharing reaches the server's cache as it was recorded. A request's
prompt is its blocks in order, the last one cut to what input_length leaves. Requests are sent at their
timestamps (open loop), counted from the first one and divided by --trace-speedup.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ladder.config import SetupError
from ladder.datasets import jsonl_records

BLOCK_TOKENS = 512  # Mooncake's block: the tokens one hash id stands for
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(frozen=True)
class TraceRequest:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class Trace:
    source: str
    requests: tuple[TraceRequest, ...]  # in timestamp order

    def due_times(self, speedup: float) -> list[float]:
        """Seconds after the replay starts at which each request is due."""
        first = self.requests[0].timestamp_ms
        return [(r.timestamp_ms - first) / 1e3 / speedup for r in self.requests]

    def mean_rate(self, speedup: float) -> float:
        """Requests per second over the replay, (n - 1) / span; inf when every request is due at once."""
        span = self.due_times(speedup)[-1]
        return (len(self.requests) - 1) / span if span > 0 else math.inf


def _count(obj: dict, key: str, where: str) -> int:
    value = obj[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SetupError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _request(obj: object, where: str) -> TraceRequest:
    if not isinstance(obj, dict) or not all(k in obj for k in FIELDS):
        raise SetupError(f"{where}: expected an object with {', '.join(FIELDS)}")
    ts = obj["timestamp"]
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not math.isfinite(ts) or ts < 0:
        raise SetupError(f"{where}: timestamp must be a number of milliseconds >= 0, got {ts!r}")
    input_length, output_length = _count(obj, "input_length", where), _count(obj, "output_length", where)
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise SetupError(f"{where}: hash_ids must be a list of integers, got {ids!r}")
    blocks = math.ceil(input_length / BLOCK_TOKENS)
    if len(ids) != blocks:
        raise SetupError(f"{where}: input_length {input_length} takes {blocks} blocks of {BLOCK_TOKENS} tokens, "
                         f"but hash_ids names {len(ids)}")
    return TraceRequest(float(ts), input_length, output_length, tuple(ids))


def read_trace(path: Path) -> Trace:
    requests = [_request(obj, where) for obj, where in jsonl_records(path, "trace")]
    return Trace(str(path), tuple(sorted(requests, key=lambda r: r.timestamp_ms)))


# (hash id, tokens) -> the first `tokens` tokens' worth of that block's text; the same id, the same words
BlockText = Callable[[int, int], str]


def prompt_text(req: TraceRequest, block: BlockText, overhead: int) -> str:
    """The request's blocks in order, each BLOCK_TOKENS tokens but the last, which gets what input_length
    leaves once the server's own tokens around a prompt (template, BOS, cache-bust tag) are counted."""
    last = max(1, req.input_length - overhead - BLOCK_TOKENS * (len(req.hash_ids) - 1))
    sizes = [BLOCK_TOKENS] * (len(req.hash_ids) - 1) + [last]
    return " ".join(block(h, n) for h, n in zip(req.hash_ids, sizes, strict=True))
