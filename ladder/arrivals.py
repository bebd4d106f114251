"""Open-loop arrivals (`--request-rate`): when each request is due, and whether the client sent it on time.

Intervals are gamma-distributed with shape = burstiness and mean 1/rate, as in `vllm bench serve`:
burstiness 1 is a Poisson process, below 1 burstier, above 1 more regular. The first request is due at 0.

The client can fall behind its own schedule (a busy event loop, a full --max-concurrency cap): a request
sent more than LATE_TOLERANCE_S after it was due is late. Late requests are counted and flag their rung,
because the server then saw less load than the rate says. At inf every request is due at t = 0: there is
no schedule to fall behind, and the runner records no lateness.
"""

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

LATE_TOLERANCE_S = 0.010


def due_times(num: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds after the phase start at which each of `num` requests is due."""
    if rate == float("inf"):
        return [0.0] * num  # vLLM's "inf": everything at once
    gen = np.random.default_rng(seed)
    gaps = gen.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=max(num - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()][:num]


@dataclass(frozen=True)
class Lateness:
    num_late: int  # sent more than LATE_TOLERANCE_S after due
    max_ms: float
    p99_ms: float


def lateness(due: Sequence[float], sent: Sequence[float]) -> Lateness:
    late = [max(0.0, s - d) for d, s in zip(due, sent, strict=True)]
    if not late:
        return Lateness(0, 0.0, 0.0)
    return Lateness(num_late=sum(x > LATE_TOLERANCE_S for x in late), max_ms=1e3 * max(late),
                    p99_ms=1e3 * float(np.percentile(late, 99)))


async def dispatch(due: Sequence[float], send: Callable[[int, float], Awaitable[None]],
                   clock: Callable[[], float], sleep: Callable[[float], Awaitable[None]],
                   stop_after_s: float | None = None) -> int:
    """Call send(i, t_due) for each request in order once its time has come; return how many were sent.

    `send` returns once the request is on its way (a capped caller waits there for a free slot, which
    then shows as lateness). With stop_after_s, requests due after that many seconds are not sent.
    """
    start = clock()
    for i, offset in enumerate(due):
        if stop_after_s is not None and offset > stop_after_s:
            return i
        wait = start + offset - clock()
        if wait > 0:
            await sleep(wait)
        await send(i, start + offset)
    return len(due)
