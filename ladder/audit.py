"""Client self-audit: is the client, not the server, what a rung measured?

Per measured phase: the client's CPU share of one core (rusage), event-loop lag (a sleep probe that wakes
late when the loop is busy) and dispatch lag (a free slot waiting for its next request to go out).

Loop lag alone does not say the client is the limit: another process on the same cores delays the loop
just as much while the client itself idles. So lag with high client CPU is CLIENT_BOUND, and lag with low
client CPU is HOST_CONTENTION.
"""

import asyncio
import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter

import numpy as np

from ladder.records import RequestRecord

PROBE_INTERVAL_S = 0.005
DEFAULT_MAX_CPU_PCT = 90.0  # of one core: the loop is single-threaded, so 100 is its ceiling
DEFAULT_MAX_LOOP_LAG_MS = 10.0  # p99 of the sleep probe's lateness


@dataclass(frozen=True)
class AuditThresholds:
    max_cpu_pct: float = DEFAULT_MAX_CPU_PCT
    max_loop_lag_ms: float = DEFAULT_MAX_LOOP_LAG_MS


@dataclass(frozen=True)
class Audit:
    cpu_pct: float
    loop_lag_p99_ms: float
    dispatch_lag_p99_ms: float
    thresholds: AuditThresholds = AuditThresholds()

    @property
    def flag(self) -> str | None:
        """CLIENT_BOUND, HOST_CONTENTION or None (see the module docstring)."""
        if self.loop_lag_p99_ms <= self.thresholds.max_loop_lag_ms:
            return None
        return "CLIENT_BOUND" if self.cpu_pct > self.thresholds.max_cpu_pct else "HOST_CONTENTION"

    @property
    def criterion(self) -> str:
        """The numbers against their thresholds, as printed beside a flag."""
        t = self.thresholds
        cpu_cmp = ">" if self.cpu_pct > t.max_cpu_pct else "<="
        lag_cmp = ">" if self.loop_lag_p99_ms > t.max_loop_lag_ms else "<="
        return (f"event-loop lag p99 {self.loop_lag_p99_ms:.1f} ms {lag_cmp} {t.max_loop_lag_ms:g} ms, "
                f"client CPU {self.cpu_pct:.0f}% of a core {cpu_cmp} {t.max_cpu_pct:g}%")


def process_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class AuditProbe:
    """Started just before a measured phase and stopped right after it. The clocks are injectable so a
    test can pin the CPU share without depending on what else the machine runs."""

    def __init__(self, thresholds: AuditThresholds = AuditThresholds(),
                 cpu_clock: Callable[[], float] = process_cpu_s, wall_clock: Callable[[], float] = perf_counter):
        self.thresholds = thresholds
        self._cpu_clock, self._wall_clock = cpu_clock, wall_clock
        self._lags: list[float] = []
        self._cpu0 = cpu_clock()
        self._t0 = wall_clock()
        self._task = asyncio.create_task(self._probe())

    async def _probe(self) -> None:
        while True:
            t = perf_counter()
            await asyncio.sleep(PROBE_INTERVAL_S)
            self._lags.append(perf_counter() - t - PROBE_INTERVAL_S)

    def stop(self, records: Sequence[RequestRecord]) -> Audit:
        self._task.cancel()
        wall = self._wall_clock() - self._t0
        sent = [r.t_send - r.t_due for r in records if r.t_send]
        return Audit(cpu_pct=100.0 * (self._cpu_clock() - self._cpu0) / wall if wall > 0 else 0.0,
                     loop_lag_p99_ms=1e3 * float(np.percentile(self._lags, 99)) if self._lags else 0.0,
                     dispatch_lag_p99_ms=1e3 * float(np.percentile(sent, 99)) if sent else 0.0,
                     thresholds=self.thresholds)
