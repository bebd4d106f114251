"""The result of one rung: OK with numbers, VOID without any, or NOT_RUN.

A VOID rung is a different type from an OK one, and it has no field that could hold a number: survivor
statistics cannot be written for it, by construction.
"""

from collections import Counter
from dataclasses import asdict, dataclass

from ladder.arrivals import Lateness
from ladder.audit import Audit
from ladder.content_types import ContentStats
from ladder.load_check import DeliveredLoad
from ladder.metrics import RungStats, SpecAcceptance, TurnStats
from ladder.prefix_cache import PrefixCacheHits
from ladder.spec_metrics import SpecDistribution

MAX_ERRORS = 5  # distinct error messages kept on a VOID row
SHUTTING_DOWN = "the server is shutting down"  # how a draining server is named, never "engine dead"


def gone_reason(dead: str) -> str:
    """The reason of a rung the engine's end cut off: a draining server is not a dead engine."""
    return f"{'shutting_down' if dead.startswith(SHUTTING_DOWN) else 'engine_dead'}: {dead}"


@dataclass(frozen=True)
class RungOk:
    concurrency: int
    num_ok: int  # warmup + measured
    prompt_hash: str
    stats: RungStats
    audit: Audit
    spec: SpecAcceptance | None
    request_rate: float | None = None  # open loop; concurrency is then the in-flight cap
    num_measured: int = 0
    num_unsent: int = 0  # measured requests --max-duration cut off before they were sent
    peak_in_flight: int = 0  # the most measured requests in flight at once
    lateness: Lateness | None = None  # open loop: requests sent after they were due
    prefix_cache: PrefixCacheHits | None = None  # None: the server has no prefix-cache counters
    server_metrics: dict | None = None  # /metrics over the measured phase: mean and peak per series
    repeats: dict | None = None  # --repeats: n, and each metric's mean, 95% CI and CV over the repeats
    turns: dict[str, TurnStats] | None = None  # --multi-turn: the measured requests by turn index ("1", ...)
    partial: bool = False  # SIGINT or SIGTERM cut the rung short: its numbers are the finished requests'
    # Acceptance over the measured requests, from their responses (None: the server reports none per request).
    spec_requests: SpecDistribution | None = None
    by_content: dict[str, ContentStats] | None = None  # --dataset mix: TPOT and acceptance per content type
    delivered_load: DeliveredLoad | None = None  # the load the rung delivered (ladder.load_check)

    status = "OK"

    @property
    def flags(self) -> tuple[str, ...]:
        out = [self.audit.flag] if self.audit.flag else []
        if self.request_rate is None and self.peak_in_flight < self.concurrency:
            out.append("BELOW_C")  # the rung never had c requests in flight: it did not measure c
        if self.lateness is not None and self.lateness.num_late:
            out.append("LATE")  # the client fell behind the arrival schedule
        if self.partial:
            out.append("PARTIAL")  # interrupted: fewer requests than the rung was to measure
        if self.delivered_load is not None and self.delivered_load.flag:
            out.append(self.delivered_load.flag)  # the load it delivered misses its configuration
        return tuple(out)


@dataclass(frozen=True)
class RungVoid:
    concurrency: int
    num_ok: int
    num_failed: int  # includes requests never sent because the engine died first
    reason: str
    errors: tuple[str, ...]
    prompt_hash: str
    request_rate: float | None = None
    failed_phases: dict[str, int] | None = None  # failures per phase, e.g. {"warmup": 1}

    status = "VOID"
    flags = ()


@dataclass(frozen=True)
class RungNotRun:
    concurrency: int
    reason: str
    request_rate: float | None = None

    status = "NOT_RUN"
    flags = ()


RungResult = RungOk | RungVoid | RungNotRun


def void_from_failures(concurrency: int, num_ok: int, failures: list[str], prompt_hash: str,
                       engine_dead: str | None, request_rate: float | None = None,
                       phases: list[str] | None = None) -> RungVoid:
    """reason: engine_dead (with its cause) or the failure kinds in order of first appearance."""
    distinct = list(dict.fromkeys(failures))
    kinds = list(dict.fromkeys(f.split(":", 1)[0] for f in failures))
    reason = gone_reason(engine_dead) if engine_dead else ", ".join(kinds)
    return RungVoid(concurrency=concurrency, num_ok=num_ok, num_failed=len(failures), reason=reason,
                    errors=tuple(distinct[:MAX_ERRORS]), prompt_hash=prompt_hash, request_rate=request_rate,
                    failed_phases=dict(Counter(phases)) if phases else None)


def to_dict(rung: RungResult) -> dict:
    row = {"concurrency": rung.concurrency, "status": rung.status, "flags": list(rung.flags)}
    row.update((k, v) for k, v in asdict(rung).items() if k != "concurrency")
    if isinstance(rung, RungOk):
        row["audit"]["flag"] = rung.audit.flag
        row["audit"]["criterion"] = rung.audit.criterion
    return row
