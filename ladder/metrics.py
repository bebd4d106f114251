"""Pure metric functions over recorded timestamps. Each definition is pinned in DEFINITIONS and printed.

Notation for one request: t_send = handed to the client, t_1 / t_L = first / last token-bearing chunk,
N = output tokens (server usage), chunks = token-bearing chunks. A chunk is token-bearing when it carries
content, reasoning or tool calls; a role-only prelude never is.
"""

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from ladder.records import RequestRecord, output_tokens

DEFINITIONS = {
    "ttft_ms": "t_1 - t_send; t_1 = first chunk carrying content, reasoning or tool calls, never a role-only prelude "
               "(n/a without streaming: the whole answer comes at once)",
    "e2e_ms": "t_L - t_send; t_L = last token-bearing chunk (the usage chunk and [DONE] excluded)",
    "tpot_ms": "(E2E - TTFT) / (N - 1) per request; N = usage.completion_tokens",
    "chunk_gap_ms": "t_i - t_(i-1) between token-bearing chunks, pooled over requests (vLLM's 'ITL')",
    "itl_token_ms": "each chunk gap split evenly over the tokens its continuous-usage delta reports, "
                    "one sample per token, pooled; only where the server sends continuous usage",
    "tokens_per_chunk": "N / chunks per request, a stopped answer's EOS (no text, no chunk) not counted; above 1 "
                        "means several tokens per step (spec acceptance); n/a without streaming",
    "request_throughput": "measured requests / window; window = first t_send -> last stream close",
    "output_throughput": "sum N / window (tok/s)",
    "total_throughput": "sum (prompt_tokens + N) / window (tok/s)",
    "per_user_tok_s": "median over requests of 1 / tpot",
    "goodput": "requests meeting every --goodput SLO (ttft, tpot, e2el in ms) / window (req/s)",
    "acceptance_rate": "d accepted / d draft_tokens from vllm:spec_decode_* counters over the measured phase",
    "acceptance_length": "1 + d accepted / d drafts",
    "prefix_cache_hit_rate": "d vllm:prefix_cache_hits / d vllm:prefix_cache_queries (tokens) over the measured "
                             "phase; n/a when the server has no such counters",
    "ttft_by_turn": "TTFT over the measured requests of each turn index of --multi-turn sessions; turn k's prompt "
                    "holds the k - 1 turns before it and their replies",
    "input_tokens_by_turn": "usage.prompt_tokens, mean over the measured requests of each turn index",
    "cached_tokens": "usage.prompt_tokens_details.cached_tokens: the prompt tokens the server says its prefix "
                     "cache served; n/a when it does not say",
    "statistics": "mean and linear-interpolated percentiles over requests (chunk gaps and token ITL pooled)",
}

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total")


@dataclass(frozen=True)
class Summary:
    mean: float
    percentiles: dict[str, float]  # "p50" -> value


@dataclass(frozen=True)
class LengthStats:
    min: int
    mean: float
    max: int


@dataclass(frozen=True)
class RequestMetrics:
    ttft: float | None  # None without streaming
    e2e: float
    tpot: float | None  # None when N < 2
    output_tokens: int
    tokens_per_chunk: float | None  # None without streaming: one answer is no chunk
    chunk_gaps: list[float]
    token_itls: list[float] | None  # None without continuous usage


@dataclass(frozen=True)
class RungStats:
    num_requests: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_throughput: float | None  # None when the server reported no prompt_tokens
    per_user_tok_s: float | None
    input_tokens: LengthStats | None
    output_tokens: LengthStats
    ttft_ms: Summary | None  # None without streaming
    e2e_ms: Summary
    tpot_ms: Summary | None
    chunk_gap_ms: Summary | None  # None when every request came in one chunk
    itl_token_ms: Summary | None
    tokens_per_chunk: Summary | None  # None without streaming
    goodput: float | None = None  # req/s meeting every SLO; None without --goodput
    goodput_fraction: float | None = None  # the share of requests meeting every SLO


@dataclass(frozen=True)
class TurnStats:
    """The measured requests of one turn index of --multi-turn sessions."""

    num_requests: int
    ttft_ms: Summary | None  # None without streaming
    input_tokens: LengthStats | None  # None when the server reported no prompt_tokens
    cached_tokens: LengthStats | None  # None when the server reported no cached_tokens


@dataclass(frozen=True)
class SpecAcceptance:
    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    acceptance_rate: float
    acceptance_length: float


def token_itls(chunk_times: Sequence[float], chunk_usage: Sequence[int]) -> list[float]:
    """Per-token inter-token latencies from the chunk gaps and the cumulative usage at each chunk."""
    out: list[float] = []
    carry = 0.0
    for i in range(1, len(chunk_times)):
        # NOTE: a chunk whose usage did not advance passes its gap on to the next chunk that did.
        carry += chunk_times[i] - chunk_times[i - 1]
        n = chunk_usage[i] - chunk_usage[i - 1]
        if n > 0:
            out.extend([carry / n] * n)
            carry = 0.0
    return out


def request_metrics(rec: RequestRecord) -> RequestMetrics:
    times = rec.chunk_times
    n = output_tokens(rec)
    e2e = times[-1] - rec.t_send
    has_usage = len(rec.chunk_usage) == len(times)
    # NOTE: without streaming the first token's arrival is not observable: TTFT and TPOT are n/a, not E2E.
    ttft = times[0] - rec.t_send if rec.streamed else None
    # NOTE: the EOS that ends a stopped answer counts in usage but has no text, so no chunk carries it: it
    # is not a token delivered alongside another (a real model without speculation would read 1.01).
    silent_stop = rec.finish_reason == "stop" and n > len(times)
    return RequestMetrics(
        ttft=ttft, e2e=e2e, tpot=(e2e - ttft) / (n - 1) if n > 1 and ttft is not None else None, output_tokens=n,
        tokens_per_chunk=(n - silent_stop) / len(times) if rec.streamed else None, chunk_gaps=[b - a for a, b in pairwise(times)],
        token_itls=token_itls(times, rec.chunk_usage) if has_usage else None)


# --goodput names, as vLLM spells them -> the RequestMetrics attribute (seconds)
SLO_METRICS = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e"}


def meets_slos(m: RequestMetrics, slos_ms: dict[str, float]) -> bool:
    """Every SLO holds; a request without a TPOT (one token) meets any TPOT SLO, as in vLLM."""
    for name, limit_ms in slos_ms.items():
        value = getattr(m, SLO_METRICS[name])
        if value is not None and value * 1e3 > limit_ms:
            return False
    return True


def request_fields(rec: RequestRecord | None) -> dict:
    """The per-request metrics in requests.jsonl, in ms; all None for a failed request (rec None)."""
    if rec is None:
        return {"ttft_ms": None, "tpot_ms": None, "e2e_ms": None, "itl_ms": None, "output_tokens": None}
    m = request_metrics(rec)
    return {"ttft_ms": 1e3 * m.ttft if m.ttft is not None else None, "tpot_ms": 1e3 * m.tpot if m.tpot is not None else None,
            "e2e_ms": 1e3 * m.e2e, "itl_ms": [1e3 * g for g in m.chunk_gaps], "output_tokens": m.output_tokens}


def summarize(values: Sequence[float], percentiles: Iterable[float], scale: float = 1.0) -> Summary:
    arr = np.asarray(values, dtype=float) * scale
    return Summary(mean=float(arr.mean()),
                   percentiles={f"p{p:g}": float(np.percentile(arr, p)) for p in percentiles})


def rung_stats(records: Sequence[RequestRecord], percentiles: Sequence[float],
               slos_ms: dict[str, float] | None = None) -> RungStats:
    """Statistics over successful measured records (the caller never passes a failed one)."""
    per = [request_metrics(r) for r in records]
    window = max(r.t_end for r in records) - min(r.t_send for r in records)
    n_out = [m.output_tokens for m in per]
    prompts = [r.prompt_tokens for r in records]
    have_prompts = all(p is not None for p in prompts)
    tpots = [m.tpot for m in per if m.tpot is not None]
    gaps = [g for m in per for g in m.chunk_gaps]
    itls = [x for m in per for x in (m.token_itls or ())]
    have_itls = bool(itls) and all(m.token_itls is not None for m in per)
    good = sum(meets_slos(m, slos_ms) for m in per) if slos_ms else 0
    per_chunk = [m.tokens_per_chunk for m in per if m.tokens_per_chunk is not None]

    def ms(values: Sequence[float]) -> Summary | None:
        return summarize(values, percentiles, 1e3) if len(values) else None

    return RungStats(
        num_requests=len(records), duration_s=window,
        request_throughput=len(records) / window, output_throughput=sum(n_out) / window,
        total_throughput=(sum(prompts) + sum(n_out)) / window if have_prompts else None,
        per_user_tok_s=_per_user(tpots),
        input_tokens=LengthStats(min(prompts), sum(prompts) / len(prompts), max(prompts)) if have_prompts else None,
        output_tokens=LengthStats(min(n_out), sum(n_out) / len(n_out), max(n_out)),
        ttft_ms=ms([m.ttft for m in per if m.ttft is not None]), e2e_ms=ms([m.e2e for m in per]), tpot_ms=ms(tpots),
        chunk_gap_ms=ms(gaps), itl_token_ms=ms(itls) if have_itls else None,
        tokens_per_chunk=summarize(per_chunk, percentiles) if per_chunk else None,
        goodput=good / window if slos_ms else None, goodput_fraction=good / len(per) if slos_ms else None)


def _lengths(values: Sequence[int | None]) -> LengthStats | None:
    if not values or any(v is None for v in values):
        return None
    return LengthStats(min(values), sum(values) / len(values), max(values))


def turn_stats(records: Sequence[RequestRecord], percentiles: Sequence[float]) -> dict[str, TurnStats]:
    """Per turn index ("1", "2", ...), over successful measured records of sessions."""
    by_turn: dict[int, list[RequestRecord]] = {}
    for rec in records:
        by_turn.setdefault(rec.turn, []).append(rec)
    out = {}
    for turn, recs in sorted(by_turn.items()):
        ttfts = [m.ttft for m in map(request_metrics, recs) if m.ttft is not None]
        out[str(turn)] = TurnStats(len(recs), summarize(ttfts, percentiles, 1e3) if ttfts else None,
                                   _lengths([r.prompt_tokens for r in recs]), _lengths([r.cached_tokens for r in recs]))
    return out


def _per_user(tpots: Sequence[float]) -> float | None:
    # NOTE: tpot is 0 when a whole response arrived in one read; its rate is unbounded, so the median
    # is reported only while it stays finite.
    rate = float(np.median([1.0 / t if t > 0 else math.inf for t in tpots])) if tpots else math.inf
    return rate if math.isfinite(rate) else None


def parse_counters(text: str, names: Sequence[str] = SPEC_COUNTERS) -> dict[str, float]:
    """Sum each named counter over its label sets in a Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            rest = line.rsplit("}", 1)[1] if "}" in line else line[len(name):]
            out[name] = out.get(name, 0.0) + float(rest.split()[0])  # an optional timestamp follows
    return out


_WORK = re.compile(r"token|iteration|decode|prefill")


def progress_counters(text: str) -> dict[str, float]:
    """The engine's work counters in a Prometheus text (a _total or a histogram's _count whose name speaks of
    tokens, iterations, decode or prefill: vllm:generation_tokens_total, vllm:iteration_tokens_total_count,
    llamacpp:n_decode_total, ...), by name and labels: one moving means the engine still works. HTTP and
    process counters are left out: the ladder's own requests and a spinning process move them."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, rest = line.rpartition("}") if "}" in line else line.partition(" ")
        name = key.split("{", 1)[0]
        if name.endswith(("_total", "_count")) and _WORK.search(name) and not name.startswith(("http", "process")):
            try:
                out[key] = float(rest.split()[0])
            except (IndexError, ValueError):
                continue
    return out


def spec_acceptance(before: dict[str, float], after: dict[str, float]) -> SpecAcceptance | None:
    """Acceptance over the measured phase from counter deltas; None when the server exposes no counters."""
    if not all(k in before and k in after for k in SPEC_COUNTERS):
        return None
    drafts, draft_tokens, accepted = (after[k] - before[k] for k in SPEC_COUNTERS)
    if drafts <= 0 or draft_tokens <= 0:
        return None
    return SpecAcceptance(num_drafts=drafts, num_draft_tokens=draft_tokens, num_accepted_tokens=accepted,
                          acceptance_rate=accepted / draft_tokens, acceptance_length=1 + accepted / drafts)
