"""Client self-audit: is the client, not the server, what a rung measured?

Per measured phase: the client's CPU share of one core (rusage), event-loop lag (a sleep probe that wakes
late when the loop is busy) and dispatch lag (a free slot waiting for its next request to go out).
"""

import asyncio
import resource
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter

import numpy as np

from ladder.records import RequestRecord

PROBE_INTERVAL_S = 0.005
MAX_CPU_PCT = 90.0  # of one core: the loop is single-threaded, so this is its ceiling
MAX_LOOP_LAG_P99_MS = 10.0


@dataclass(frozen=True)
class Audit:
    cpu_pct: float
    loop_lag_p99_ms: float
    dispatch_lag_p99_ms: float

    @property
    def client_bound(self) -> bool:
        return self.cpu_pct > MAX_CPU_PCT or self.loop_lag_p99_ms > MAX_LOOP_LAG_P99_MS


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class AuditProbe:
    """Started just before a measured phase and stopped right after it."""

    def __init__(self) -> None:
        self._lags: list[float] = []
        self._cpu0 = _cpu_s()
        self._t0 = perf_counter()
        self._task = asyncio.create_task(self._probe())

    async def _probe(self) -> None:
        while True:
            t = perf_counter()
            await asyncio.sleep(PROBE_INTERVAL_S)
            self._lags.append(perf_counter() - t - PROBE_INTERVAL_S)

    def stop(self, records: Sequence[RequestRecord]) -> Audit:
        self._task.cancel()
        wall = perf_counter() - self._t0
        sent = [r.t_send - r.t_due for r in records if r.t_send]
        return Audit(cpu_pct=100.0 * (_cpu_s() - self._cpu0) / wall,
                     loop_lag_p99_ms=1e3 * float(np.percentile(self._lags, 99)) if self._lags else 0.0,
                     dispatch_lag_p99_ms=1e3 * float(np.percentile(sent, 99)) if sent else 0.0)
