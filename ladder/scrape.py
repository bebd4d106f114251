"""Server metrics over time: /metrics scraped at a fixed interval while each phase of a rung runs.

Tick k of a rung is due at t0 + k·interval (t0 = the phase start; tick 0 is taken before the first
request is sent), and stop() takes one closing sample after the last request ended, so counters that moved
during the phase are seen by its own series. A scrape that comes back after the next
tick was due makes the scraper skip to the newest due tick and count the ones it jumped over, so that
samples + skipped is the number of intervals the phase lasted, whatever the load, and no sample is ever
taken at a time other than its own. The samples belong to their phase, rung and repeat: each phase has its
own series, started with it and stopped with it, so neither the warmup nor the pause between rungs is in
the measured phase's series, from which a rung's summary comes: its gauges over the samples taken between
the phase's first send and its last end (the requests' own window), its counters over the whole phase.

The series read vLLM's names, SGLang's where they differ, and refengine's (which are vLLM's). Counters
become per-interval series (their increase since the previous sample); a series the server does not
expose stays absent, and the rung shows it as n/a.
"""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from time import perf_counter

from prometheus_client.parser import text_string_to_metric_families

# series -> the metric names that carry it, first found wins (counters without their _total suffix)
GAUGES = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    # vLLM's two are derived from its counters below; SGLang reports them as gauges
    "prefix_cache_hit_rate": ("sglang:cache_hit_rate",),
    "spec_acceptance_rate": ("sglang:spec_accept_rate",),
    "spec_accept_length": ("sglang:spec_accept_length",),
}
COUNTERS = {
    "preemptions": "vllm:num_preemptions",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
}
# the per-rung series: gauges as read, counters as increases per interval, and two ratios of increases
SERIES = ("running", "waiting", "kv_usage", "preemptions", "spec_acceptance_rate", "spec_accept_length",
          "prefix_cache_hit_rate", "gpu_util_pct", "gpu_mem_used_mib")


def parse(text: str) -> dict[str, float]:
    """Each metric's value summed over its label sets (engines, models), by name without _total."""
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith(("_created", "_bucket", "_sum", "_count")):
                    continue
                name = sample.name.removesuffix("_total")
                out[name] = out.get(name, 0.0) + float(sample.value)
    except ValueError:  # not a Prometheus exposition (a server without /metrics answers something else)
        return {}
    return out


def reading(metrics: dict[str, float]) -> dict[str, float]:
    """The raw readings a sample keeps: gauges by series name, counters by theirs."""
    out = {}
    for series, names in GAUGES.items():
        found = next((metrics[n] for n in names if n in metrics), None)
        if found is not None:
            out[series] = found
    out.update((series, metrics[name]) for series, name in COUNTERS.items() if name in metrics)
    return out


@dataclass
class Sample:
    tick: int | None  # None: the closing sample stop() takes
    t: float  # perf_counter seconds when the scrape returned
    values: dict[str, float]  # reading() plus the GPU's, where sampled


@dataclass
class Series:
    interval_s: float
    t_start: float
    t_stop: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    num_skipped: int = 0  # ticks jumped over because a scrape came back late

    @property
    def num_ticks(self) -> int:
        """The intervals the phase lasted: tick samples plus the ticks skipped."""
        return sum(s.tick is not None for s in self.samples) + self.num_skipped


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


GAUGE_SERIES = ("running", "waiting", "kv_usage", "spec_accept_length", "gpu_util_pct", "gpu_mem_used_mib",
                "prefix_cache_hit_rate", "spec_acceptance_rate")


def per_interval(samples: list[Sample], window: tuple[float, float] | None = None) -> dict[str, list[float]]:
    """Each series as values over time: gauges as sampled, only inside `window` (the phase's first send to
    its last end) when given; counters as the increase since the previous sample (so a series of n samples
    has n - 1 values, over the whole phase); ratios of increases where the denominator moved."""
    out: dict[str, list[float]] = {name: [] for name in SERIES}
    for prev, cur in zip([None, *samples], samples):
        # NOTE: tick 0 comes before the first request and the closing sample after the last: both read an
        # idle server, so a gauge's mean over them would say the rung held fewer requests than it did.
        if window is None or window[0] <= cur.t <= window[1]:
            for name in GAUGE_SERIES:
                if name in cur.values:
                    out[name].append(cur.values[name])
        if prev is None:
            continue
        delta = {k: cur.values[k] - prev.values[k] for k in COUNTERS if k in cur.values and k in prev.values}
        if "preemptions" in delta:
            out["preemptions"].append(delta["preemptions"])
        if (rate := _ratio(delta.get("spec_accepted_tokens"), delta.get("spec_draft_tokens"))) is not None:
            out["spec_acceptance_rate"].append(rate)
        if (rate := _ratio(delta.get("prefix_cache_hits"), delta.get("prefix_cache_queries"))) is not None:
            out["prefix_cache_hit_rate"].append(rate)
    return out


def summary(series: Series, window: tuple[float, float] | None = None) -> dict:
    """The rung's view: mean and peak of each series (None: the server does not expose it, or no gauge
    sample fell inside `window`, the requests' own span)."""
    values = per_interval(series.samples, window)
    return {"interval_s": series.interval_s, "duration_s": series.t_stop - series.t_start,
            "num_ticks": series.num_ticks, "num_skipped": series.num_skipped,
            "series": {name: ({"mean": sum(v) / len(v), "peak": max(v)} if v else None)
                       for name, v in values.items()}}


class Scraper:
    """Scrapes `fetch()` every interval_s from start() until stop(); `gpu()` adds NVML readings."""

    def __init__(self, fetch: Callable[[], Awaitable[str]], interval_s: float,
                 gpu: Callable[[], dict[str, float]] | None = None):
        self.fetch, self.interval_s, self.gpu = fetch, interval_s, gpu
        self.series: Series | None = None
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        """Take tick 0, then scrape in the background; returns once tick 0 is in."""
        self.series = Series(self.interval_s, perf_counter())
        self.series.samples.append(await self._sample(0))
        self._task = asyncio.create_task(self._loop(self.series))

    async def stop(self) -> Series:
        self._stop.set()
        await self._task
        self.series.t_stop = perf_counter()
        self.series.samples.append(await self._sample(None))
        return self.series

    async def _sample(self, tick: int | None) -> Sample:
        values = reading(parse(await self.fetch()))
        if self.gpu is not None:
            values.update(self.gpu())
        return Sample(tick, perf_counter(), values)

    async def _loop(self, series: Series) -> None:
        tick = 0
        while True:
            now = series.samples[-1].t
            # NOTE: the next tick is the first one still ahead; ticks that fell due while this scrape ran
            # are skipped and counted, never taken late.
            due = int((now - series.t_start) / self.interval_s) + 1
            series.num_skipped += due - tick - 1
            tick = due
            wait = series.t_start + tick * self.interval_s - perf_counter()
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=max(0.0, wait))
                return
            except TimeoutError:
                series.samples.append(await self._sample(tick))
