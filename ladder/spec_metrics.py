"""Per-request speculative decoding: each request's drafts from its response, and their spread over a rung.

A server that reports them (refengine's `usage.speculative_decoding`, vLLM's `metrics.speculative_decoding`
with --per-request-spec-decode-metrics: vllm#48915, the names AIPerf reads, aiperf#1191) gives every request
its acceptance length, 1 + accepted / verify steps. A rung then has a distribution over its requests beside
the step-weighted mean, which is the /metrics figure 1 + d accepted / d drafts for the same requests. A server
without them leaves the rung to its /metrics deltas (RungOk.spec) alone.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

HISTOGRAM_BIN = 0.25  # tokens per verify step: the width of the acceptance-length histogram's bins


@dataclass(slots=True)
class RequestSpec:
    """One request's drafts, as its server counted them."""

    num_spec_steps: int  # verify steps that carried a draft
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: list[int] = field(default_factory=list)  # [i]: steps that accepted draft position i

    @property
    def acceptance_length(self) -> float:
        return 1 + self.num_accepted_tokens / self.num_spec_steps


def _count(block: dict, *names: str) -> int | None:
    for name in names:
        if isinstance(block.get(name), int | float) and not isinstance(block.get(name), bool):
            return int(block[name])
    return None


def read_spec(obj: dict) -> RequestSpec | None:
    """The request's drafts from a response body or its final chunk: usage.speculative_decoding, else vLLM's
    top-level metrics.speculative_decoding; None when it carries neither or verified no draft."""
    for block in ((obj.get("usage") or {}).get("speculative_decoding"),
                  (obj.get("metrics") or {}).get("speculative_decoding")):
        if not isinstance(block, dict):
            continue
        steps = _count(block, "num_spec_steps")
        drafted = _count(block, "num_draft_tokens")
        accepted = _count(block, "num_accepted_draft_tokens")
        if steps and drafted is not None and accepted is not None:
            per_pos = block.get("num_accepted_tokens_per_pos") or []
            return RequestSpec(steps, drafted, accepted, [int(v) for v in per_pos])
    return None


@dataclass(frozen=True)
class SpecDistribution:
    """A rung's acceptance over its requests: every request counts once in the percentiles and the histogram,
    and each verify step once in the weighted mean (the /metrics figure)."""

    num_requests: int  # requests that verified drafts
    weighted_acceptance_length: float  # 1 + sum accepted / sum steps: /metrics' mean over the same requests
    acceptance_rate: float  # sum accepted / sum drafted
    p10: float
    p50: float
    p90: float
    mean_of_requests: float  # each request's acceptance length, averaged unweighted
    acceptance_per_pos: list[float]  # [i]: share of verify steps that accepted draft position i
    histogram: dict  # {"edges": [...], "counts": [...]}: requests per acceptance-length bin
    source: str = "usage"


def histogram(lengths: Sequence[float]) -> dict:
    top = max(2.0, math.ceil(max(lengths) / HISTOGRAM_BIN) * HISTOGRAM_BIN + HISTOGRAM_BIN)
    edges = np.arange(1.0, top + HISTOGRAM_BIN / 2, HISTOGRAM_BIN)
    counts, _ = np.histogram(lengths, bins=edges)
    return {"edges": [round(float(e), 4) for e in edges], "counts": [int(c) for c in counts]}


def distribution(specs: Sequence[RequestSpec | None]) -> SpecDistribution | None:
    """The spread over the requests that reported drafts; None when none did (the server reports no
    per-request figures, or nothing was drafted)."""
    got = [s for s in specs if s is not None]
    if not got:
        return None
    lengths = [s.acceptance_length for s in got]
    steps = sum(s.num_spec_steps for s in got)
    accepted = sum(s.num_accepted_tokens for s in got)
    drafted = sum(s.num_draft_tokens for s in got)
    width = max(len(s.accepted_per_pos) for s in got)
    per_pos = [sum(s.accepted_per_pos[i] for s in got if i < len(s.accepted_per_pos)) / steps for i in range(width)]
    p10, p50, p90 = (float(v) for v in np.percentile(lengths, [10, 50, 90]))
    return SpecDistribution(num_requests=len(got), weighted_acceptance_length=1 + accepted / steps,
                            acceptance_rate=accepted / drafted if drafted else 0.0, p10=p10, p50=p50, p90=p90,
                            mean_of_requests=float(np.mean(lengths)), acceptance_per_pos=per_pos,
                            histogram=histogram(lengths))
