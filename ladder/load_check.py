"""Load that proves itself: the load a rung delivered, from its measured requests' send and end times, against
the load it was configured for (inference-perf tests its own stimulus the same way, ip#633).

- Closed loop (--c): the in-flight count over the steady window, from the moment c requests are first in flight
  (the ramp before it excluded) to the last send (the drain after it excluded): its time-weighted mean, and
  its minimum: the lowest count held for MIN_HOLD of the window (a slot is empty for a moment between a
  request's end and the next send; that turnaround is not a missing request). The rung is LOAD_MISS when the mean is below (1 - TOLERANCE) * c: the
  client held requests back, so the rung did not measure c.
- Open loop (a rate): the achieved rate, (n - 1) / (last send - first send), and a goodness-of-fit of the
  gaps between sends against the configured Gamma(shape b, mean 1 / rate) (b = 1: Poisson arrivals): the
  one-sample Kolmogorov-Smirnov statistic D and its p-value (scipy.stats.kstest where scipy is installed, else
  D against the exponential by hand, p from the Kolmogorov distribution's asymptotic series; b != 1 without
  scipy reports D as n/a). LOAD_MISS when the rate misses by more than max(TOLERANCE, 3 / sqrt(n - 1)) (a
  Poisson sample's own spread) or p < P_MIN. A rate of inf has no gaps to fit: only the rate is n/a.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TOLERANCE = 0.10  # the delivered load may miss its configuration by this fraction before the rung is flagged
MIN_HOLD = 0.05  # the share of the steady window a count must be held for to be its minimum
P_MIN = 0.01  # a goodness-of-fit p-value below this flags the arrivals as not the configured distribution


@dataclass(frozen=True)
class DeliveredLoad:
    configured: float  # c, or the rate (req/s)
    mean_in_flight: float | None = None  # closed loop: time-weighted over the steady window
    min_in_flight: int | None = None  # closed loop: the lowest count held for MIN_HOLD of the steady window
    steady_s: float | None = None  # closed loop: the steady window's length
    achieved_rate: float | None = None  # open loop (req/s)
    ks_statistic: float | None = None  # open loop: Kolmogorov-Smirnov D of the gaps against the configuration
    ks_pvalue: float | None = None
    missed: str | None = None  # why the delivered load misses its configuration; None when it does not

    @property
    def flag(self) -> str | None:
        return "LOAD_MISS" if self.missed else None


def closed_loop(c: int, sends: Sequence[float], ends: Sequence[float]) -> DeliveredLoad | None:
    """The in-flight count between the ramp and the drain; None when c was never reached or nothing is left
    between them (BELOW_C says the first)."""
    events = sorted([(t, 1) for t in sends] + [(t, -1) for t in ends], key=lambda e: (e[0], -e[1]))
    level, start, prev_t = 0, None, 0.0
    last_send = max(sends)
    held: dict[int, float] = {}  # in-flight count -> seconds at it within the steady window
    for t, step in events:
        if start is not None and t <= last_send:
            held[level] = held.get(level, 0.0) + t - prev_t
        level += step
        if start is None and level >= c:
            start = t
        prev_t = t
    if start is None or last_send <= start:
        return None
    span = last_send - start
    mean = sum(n * s for n, s in held.items()) / span
    floor = min((n for n, s in held.items() if s >= MIN_HOLD * span), default=max(held, key=held.get))
    missed = (f"mean in flight {mean:.2f} < {1 - TOLERANCE:.2f} x c={c} over the steady {span:.2f} s"
              if mean < (1 - TOLERANCE) * c else None)
    return DeliveredLoad(c, mean_in_flight=mean, min_in_flight=floor, steady_s=span, missed=missed)


def _kolmogorov_p(d: float, n: int) -> float:
    """P(D_n >= d) for large n, from the Kolmogorov distribution (with Stephens' small-n correction)."""
    x = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    if x < 0.2:
        return 1.0
    return max(0.0, min(1.0, 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * x * x) for k in range(1, 101))))


def _fit(gaps: np.ndarray, rate: float, burstiness: float) -> tuple[float | None, float | None]:
    try:
        from scipy import stats
    except ImportError:
        if burstiness != 1.0:
            return None, None
        xs = np.sort(gaps)
        cdf = 1 - np.exp(-rate * xs)
        n = len(xs)
        d = float(max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n)))
        return d, _kolmogorov_p(d, n)
    result = stats.kstest(gaps, stats.gamma(a=burstiness, scale=1 / (rate * burstiness)).cdf)
    return float(result.statistic), float(result.pvalue)


def open_loop(rate: float, burstiness: float, sends: Sequence[float]) -> DeliveredLoad | None:
    """The achieved rate and the arrivals' fit; None with fewer than 3 sends (two gaps fit nothing)."""
    if len(sends) < 3 or math.isinf(rate):
        return None
    ts = np.sort(np.asarray(sends, dtype=float))
    span = ts[-1] - ts[0]
    achieved = (len(ts) - 1) / span if span > 0 else math.inf
    d, p = _fit(np.diff(ts), rate, burstiness)
    allowed = max(TOLERANCE, 3 / math.sqrt(len(ts) - 1))
    reasons = []
    if abs(achieved / rate - 1) > allowed:
        reasons.append(f"achieved {achieved:.2f} req/s against {rate:g} (tolerance {100 * allowed:.0f}%)")
    if p is not None and p < P_MIN:
        reasons.append(f"the gaps do not fit the configured arrivals (KS D {d:.3f}, p {p:.2g} < {P_MIN:g})")
    return DeliveredLoad(rate, achieved_rate=achieved, ks_statistic=d, ks_pvalue=p,
                         missed="; ".join(reasons) or None)
