"""What the server says about itself: /metrics, its RSS, and latency percentiles per sample window."""

import asyncio
import time

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from .load import Load


def scrape(url: str) -> dict[str, float]:
    """/metrics as {name[label=value]: value}, the model_name label left out."""
    values = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for s in family.samples:
            labels = "".join(f"[{k}={v}]" for k, v in sorted(s.labels.items()) if k != "model_name")
            values[s.name + labels] = s.value
    return values


def total(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k == prefix or k.startswith(prefix + "["))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Sampler:
    def __init__(self, url: str, pid: int, every: float) -> None:
        self.url = url
        self.process = psutil.Process(pid)
        self.every = every
        self.samples: list[dict] = []

    def take(self, load: Load, since: float) -> dict:
        """One sample; called on the event loop's thread, so the tally does not move meanwhile."""
        m = scrape(self.url)
        window = [t for t in load.recorder.timings if t.end > since]
        tpots = [t.tpot for t in window if t.tpot is not None]
        sample = {
            "t": round(time.monotonic() - load.recorder.start, 1),
            "rss_mib": self.process.memory_info().rss / 2**20,
            "kv_blocks_in_use": m["refengine:kv_cache_total_blocks"] - m["refengine:kv_cache_free_blocks"],
            "requests_in_flight": m["refengine:requests_in_flight"],
            "requests_running": m["vllm:num_requests_running"],
            "requests_waiting": m["vllm:num_requests_waiting"],
            "ttft_p50": percentile([t.ttft for t in window], 0.5),
            "ttft_p99": percentile([t.ttft for t in window], 0.99),
            "tpot_p50": percentile(tpots, 0.5),
            "tpot_p99": percentile(tpots, 0.99),
            "metrics": {k: v for k, v in m.items() if "_bucket" not in k and "refengine:engine_info" not in k},
            "client": load.tally.snapshot(),
        }
        self.samples.append(sample)
        return sample

    async def loop(self, load: Load) -> None:
        since = 0.0
        while True:
            await asyncio.sleep(self.every)
            sample = self.take(load, since)
            since = sample["t"]
            c = sample["client"]
            print(
                f"[{sample['t']:7.1f}s] rss {sample['rss_mib']:.0f} MiB, blocks {sample['kv_blocks_in_use']:.0f}, "
                f"in flight {sample['requests_in_flight']:.0f}, done {sum(c['completed'].values())}, "
                f"429 {c['refused_429']}, 5xx {sum(c['server_errors'].values())}, "
                f"tpot p99 {fmt_ms(sample['tpot_p99'])}",
                flush=True,
            )


def fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def settle(url: str, timeout: float = 120) -> dict[str, float]:
    """/metrics once nothing is in flight any more (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        idle = m["refengine:requests_in_flight"] == m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0
        if (idle and m["refengine:kv_cache_free_blocks"] == m["refengine:kv_cache_total_blocks"]) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)
