"""The server's prefix-cache hit rate over a rung, from vLLM's counters in /metrics read before and after
the measured phase (`vllm:prefix_cache_queries` and `vllm:prefix_cache_hits`, in tokens). A server without
them has no hit rate: n/a, never zero."""

from dataclasses import dataclass

PREFIX_CACHE_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


@dataclass(frozen=True)
class PrefixCacheHits:
    queries: float  # prompt tokens looked up in the cache over the measured phase
    hits: float  # of them, served from the cache
    hit_rate: float | None  # hits / queries; None when nothing was looked up


def prefix_cache_hits(before: dict[str, float], after: dict[str, float]) -> PrefixCacheHits | None:
    """None when the server exposes no prefix-cache counters."""
    if not all(k in before and k in after for k in PREFIX_CACHE_COUNTERS):
        return None
    queries, hits = (after[k] - before[k] for k in PREFIX_CACHE_COUNTERS)
    return PrefixCacheHits(queries=queries, hits=hits, hit_rate=hits / queries if queries > 0 else None)
