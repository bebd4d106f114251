"""Soak: `refengine serve` under a long, mixed, hostile load, checked for leaks and drift.

    python benchmarks/soak.py [--model smollm2] [--speculative-config JSON] [--concurrency 32]
                              [--duration 1800] [--out reports/soak.md] [--json soak.json] [--counts-only]

It starts `refengine serve` on a free loopback port and runs `--concurrency` client loops against it:
prompt and output lengths drawn (seeded) from lognormals shaped like ShareGPT's, scaled to a CPU; 10%
of streams closed by the client at a random point; 5% malformed requests; a few clients that read
their stream slowly; and, every `--burst-every` seconds, a burst of short requests past the server's
queue bound (--max-waiting-requests), which must be refused with 429. Every `--sample-every` seconds it
records the server's RSS, KV blocks in use against requests in flight, the /metrics counters, p50/p99
TTFT and TPOT, and errors by kind.

It fails (exit 1) on any 5xx; a KV block still in use after the load stops; /metrics counters that
disagree with the client's; a variant of the mix that never happened; and, unless --counts-only,
RSS growing by more than 10% after the first window (5 minutes) or p99 TPOT of the last window more
than 20% above the first. A benchmark, not a test: the CI runs a 60-second --counts-only slice.
"""

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shlex
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
MAX_OUTPUT_TOKENS = 256
CHAT_TEMPLATE_TOKENS = 64  # room left for the chat template around the prompt
MIN_WINDOW_REQUESTS = 20  # finished requests a window needs for its p99 TPOT to be compared
WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week case point "
    "government company number group problem fact river light story garden engine question answer market"
).split()
# Bodies a careless or hostile client sends; each must get a 4xx and change nothing.
MALFORMED: list[tuple[str, bytes, dict[str, str]]] = [
    ("/v1/completions", b'{"prompt": "x", "max_tokens": ', {}),
    ("/v1/completions", b'{"max_tokens": 4}', {}),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": -1}', {}),
    ("/v1/completions", b'{"prompt": "x", "temperature": "hot"}', {}),
    ("/v1/completions", b'{"prompt": "a\\ud800b"}', {}),
    ("/v1/completions", b'{"prompt": "x", "model": "no-such-model"}', {}),
    ("/v1/chat/completions", b'{"messages": []}', {}),
    ("/v1/chat/completions", b'{"messages": [{"role": "robot", "content": "x"}]}', {}),
    ("/v1/completions", b'{"prompt": "x"}', {"x-padding": "a" * 200_000}),
    ("/v1/completions", b"\xff\xfe not utf-8", {}),
]


@dataclass(frozen=True)
class SoakConfig:
    model: str
    speculative_config: str | None
    concurrency: int
    duration_s: float
    sample_every_s: float
    window_s: float  # the first and last windows compared for RSS growth and TPOT drift
    max_num_seqs: int
    max_waiting_requests: int
    burst_every_s: float
    abort_fraction: float
    malformed_fraction: float
    num_slow_clients: int
    max_model_len: int
    threads: int | None
    seed: int
    counts_only: bool

    @property
    def capacity(self) -> int:
        return self.max_num_seqs + self.max_waiting_requests


@dataclass
class Tally:
    """What the client saw, all counts."""

    completed: Counter = field(default_factory=Counter)  # by finish reason
    completion_tokens: int = 0  # summed over completed requests (their usage)
    aborted_by_client: int = 0
    aborted_seen_tokens: int = 0  # tokens the client had read from the streams it closed
    refused_429: int = 0
    malformed: Counter = field(default_factory=Counter)  # by status
    server_errors: Counter = field(default_factory=Counter)  # 5xx, or error events in a stream
    transport_errors: Counter = field(default_factory=Counter)
    slow_reads: int = 0
    bursts: int = 0

    def snapshot(self) -> dict:
        # Not dataclasses.asdict: it rebuilds a Counter from its items, which counts them as keys.
        return {k: dict(v) if isinstance(v, Counter) else v for k, v in vars(self).items()}


@dataclass(frozen=True)
class Timing:
    end: float  # monotonic seconds since the load began
    ttft: float
    tpot: float | None


class Recorder:
    """Sends requests and records what came back: the tally and each finished request's timing."""

    def __init__(self) -> None:
        self.tally = Tally()
        self.timings: list[Timing] = []
        self.start = time.monotonic()

    # ---- one request ---------------------------------------------------------------------------

    async def stream(
        self, client: httpx.AsyncClient, path: str, body: dict, *, abort_after: int | None, read_delay: float
    ) -> None:
        t0 = time.monotonic()
        ttft = None
        seen = 0
        usage = finish = None
        async with client.stream("POST", path, json=body) as response:
            if response.status_code == 429:
                self.tally.refused_429 += 1
                return
            if response.status_code >= 500:
                self.tally.server_errors[str(response.status_code)] += 1
                return
            if response.status_code != 200:
                self.tally.malformed[f"unexpected {response.status_code}"] += 1
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    self.tally.server_errors[event["error"].get("code") or "error_event"] += 1
                    return
                for choice in event.get("choices", []):
                    text = choice.get("text") or choice.get("delta", {}).get("content")
                    if text and ttft is None:
                        ttft = time.monotonic() - t0
                    finish = choice.get("finish_reason") or finish
                    seen += bool(text)  # events with text: never more than the tokens they carry
                usage = event.get("usage") or usage
                if abort_after is not None and finish is None and seen >= abort_after:
                    self.tally.aborted_by_client += 1
                    self.tally.aborted_seen_tokens += seen
                    return  # leaving the block closes the connection mid-stream
                if read_delay:
                    await asyncio.sleep(read_delay)
        end = time.monotonic()
        if finish is None or usage is None:
            self.tally.server_errors["stream_ended_without_finish"] += 1
            return
        self.tally.completed[finish] += 1
        n = usage["completion_tokens"]
        self.tally.completion_tokens += n
        if ttft is not None and not read_delay:  # a slow reader's latency is its own
            tpot = (end - t0 - ttft) / (n - 1) if n > 1 else None
            self.timings.append(Timing(end - self.start, ttft, tpot))

    async def malformed(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        path, raw, headers = rng.choice(MALFORMED)
        response = await client.post(path, content=raw, headers={"content-type": "application/json", **headers})
        if response.status_code >= 500:
            self.tally.server_errors[str(response.status_code)] += 1
        elif response.status_code == 429:
            self.tally.refused_429 += 1
        else:
            self.tally.malformed[str(response.status_code)] += 1

    async def guarded(self, work) -> None:  # noqa: ANN001 - a coroutine
        try:
            await work
        except httpx.TransportError as e:
            self.tally.transport_errors[type(e).__name__] += 1

class Load:
    def __init__(self, config: SoakConfig, url: str) -> None:
        self.config = config
        self.url = url
        self.recorder = Recorder()
        self.tally = self.recorder.tally
        self.rng = random.Random(config.seed)
        self.stop_at = self.recorder.start + config.duration_s
    # ---- request shapes ------------------------------------------------------------------------

    def request(self) -> tuple[str, dict]:
        """ShareGPT's prompts have a median near 100 tokens and replies near 200, both long-tailed; on
        a CPU both are scaled down by 4, keeping the shape. The prompt is cut to fit the context,
        counting a token per character (the fewest any of the models' tokenizers give)."""
        num_words = max(int(self.rng.lognormvariate(3.2, 0.9)), 4)
        output_len = min(max(int(self.rng.lognormvariate(3.9, 0.7)), 4), MAX_OUTPUT_TOKENS)
        room = self.config.max_model_len - output_len - CHAT_TEMPLATE_TOKENS
        words = " ".join(self.rng.choice(WORDS) for _ in range(num_words))[:room]
        return self.body(words, output_len)

    def body(self, words: str, output_len: int) -> tuple[str, dict]:
        common = {
            "max_tokens": output_len,
            "ignore_eos": True,
            "temperature": self.rng.choice([0.0, 0.7]),
            "seed": self.rng.randrange(1 << 30),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.rng.random() < 0.5:
            return "/v1/chat/completions", {"messages": [{"role": "user", "content": words}], **common}
        return "/v1/completions", {"prompt": words, **common}

    # ---- the loops -----------------------------------------------------------------------------

    async def client_loop(self, client: httpx.AsyncClient, slow: bool) -> None:
        while time.monotonic() < self.stop_at:
            if not slow and self.rng.random() < self.config.malformed_fraction:
                await self.recorder.guarded(self.recorder.malformed(client, self.rng))
                continue
            path, body = self.request()
            abort_after = None
            if not slow and self.rng.random() < self.config.abort_fraction:
                abort_after = self.rng.randint(1, max(1, body["max_tokens"] // 2))
            if slow:
                self.tally.slow_reads += 1
            delay = 0.05 if slow else 0
            await self.recorder.guarded(self.recorder.stream(client, path, body, abort_after=abort_after, read_delay=delay))

    async def burst_loop(self, client: httpx.AsyncClient) -> None:
        """Bursts of short requests, more than the queue holds: the excess must get 429."""
        while time.monotonic() + self.config.burst_every_s < self.stop_at:
            await asyncio.sleep(self.config.burst_every_s)
            self.tally.bursts += 1
            size = self.config.capacity + self.config.concurrency
            await asyncio.gather(
                *(
                    self.recorder.guarded(self.recorder.stream(client, *self.body("a short one", 8), abort_after=None, read_delay=0))
                    for _ in range(size)
                )
            )

    async def run(self, sampler: "Sampler") -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=self.url, timeout=600, limits=limits) as client:
            slow = [True] * self.config.num_slow_clients
            loops = [self.client_loop(client, s) for s in slow + [False] * (self.config.concurrency - len(slow))]
            sampling = asyncio.create_task(sampler.loop(self))
            await asyncio.gather(*loops, self.burst_loop(client))
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling


# ---- the server, and what it says about itself ------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(config: SoakConfig, port: int) -> list[str]:
    refengine = str(Path(sys.executable).with_name("refengine"))
    cmd = [
        refengine, "serve", "--model", config.model, "--port", str(port), "--log-level", "warning",
        "--max-num-seqs", str(config.max_num_seqs), "--max-model-len", str(config.max_model_len),
        "--max-waiting-requests", str(config.max_waiting_requests),
    ]  # fmt: skip
    if config.speculative_config:
        cmd += ["--speculative-config", config.speculative_config]
    if config.threads:
        cmd += ["--threads", str(config.threads)]
    return cmd


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


async def unloaded_tpot(url: str, rng: random.Random) -> float | None:
    """TPOT of one request alone on the server, three times: the figure loaded TPOT is set against."""
    recorder = Recorder()
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for _ in range(3):
            body = {"prompt": " ".join(rng.choice(WORDS) for _ in range(24)), "max_tokens": 64, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
            await recorder.stream(client, "/v1/completions", body, abort_after=None, read_delay=0)
    tpots = [t.tpot for t in recorder.timings if t.tpot is not None]
    return statistics.median(tpots) if tpots else None


def settle(url: str, timeout: float = 120) -> dict[str, float]:
    """/metrics once nothing is in flight any more (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        idle = m["refengine:requests_in_flight"] == m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0
        if (idle and m["refengine:kv_cache_free_blocks"] == m["refengine:kv_cache_total_blocks"]) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


# ---- verdicts ---------------------------------------------------------------------------------------


def verdicts(config: SoakConfig, tally: Tally, final: dict[str, float], samples: list[dict], timings: list[Timing]) -> list[dict]:
    def check(name: str, ok: bool, detail: str) -> dict:
        return {"check": name, "ok": bool(ok), "detail": detail}

    completed = sum(tally.completed.values())
    success = total(final, "vllm:request_success_total")
    disconnects = final.get("refengine:request_aborted_total[reason=client_disconnect]", 0)
    generated = final["vllm:generation_tokens_total"]
    in_use = final["refengine:kv_cache_total_blocks"] - final["refengine:kv_cache_free_blocks"]
    rejected = final.get("refengine:request_rejected_total[reason=queue_full]", 0)
    out = [
        check("no 5xx", not tally.server_errors, f"server errors: {dict(tally.server_errors) or 0}"),
        check("no transport errors", not tally.transport_errors, f"{dict(tally.transport_errors) or 0}"),
        check("no KV block leaked", in_use == 0 and final["refengine:requests_in_flight"] == 0,
              f"{in_use:.0f} blocks in use, {final['refengine:requests_in_flight']:.0f} requests in flight after the load"),
        # A stream the client closes just as it finishes may count as a success on the server: the two
        # outcomes are compared as a sum, and each bounded by the client's figure.
        check("/metrics: every admitted request counted once",
              success + disconnects == completed + tally.aborted_by_client
              and success >= completed and disconnects <= tally.aborted_by_client,
              f"server {success:.0f} finished + {disconnects:.0f} disconnects; "
              f"client {completed} finished + {tally.aborted_by_client} closed"),
        check("/metrics: 429s equal the client's", rejected == tally.refused_429,
              f"server {rejected:.0f}, client {tally.refused_429}"),
        check("/metrics: generation tokens cover what clients were sent",
              generated >= tally.completion_tokens + tally.aborted_seen_tokens
              and (tally.aborted_by_client > 0 or generated == tally.completion_tokens),
              f"server {generated:.0f}; client {tally.completion_tokens} in finished requests "
              f"+ {tally.aborted_seen_tokens} read from closed streams"),
        check("every variant of the mix happened",
              completed and tally.aborted_by_client and sum(tally.malformed.values()) and tally.refused_429
              and tally.slow_reads and tally.bursts,
              f"{completed} finished, {tally.aborted_by_client} closed by the client, "
              f"{sum(tally.malformed.values())} malformed ({dict(tally.malformed)}), {tally.refused_429} refused with 429, "
              f"{tally.slow_reads} slow reads, {tally.bursts} bursts"),
    ]  # fmt: skip
    if config.counts_only:
        return out
    first = [s for s in samples if s["t"] <= config.window_s]
    name = "RSS grows at most 10% after the first window"
    if not first or samples[-1]["t"] < config.window_s:
        out.append(check(name, False, "the run was shorter than one window: nothing to compare"))
    else:
        base, last = first[-1]["rss_mib"], samples[-1]["rss_mib"]
        out.append(check(name, last <= 1.10 * base,
                         f"{base:.0f} MiB at {first[-1]['t']:.0f} s, {last:.0f} MiB at the end ({last / base - 1:+.1%})"))
    end = max((t.end for t in timings), default=0)
    early = [t.tpot for t in timings if t.tpot is not None and t.end <= config.window_s]
    late = [t.tpot for t in timings if t.tpot is not None and t.end >= end - config.window_s]
    name = "p99 TPOT drifts up at most 20% (first window to last)"
    if min(len(early), len(late)) < MIN_WINDOW_REQUESTS:
        # Too few requests for a p99 to mean anything: the check cannot pass, so it fails, saying why.
        out.append(check(name, False, f"too few requests to judge: {len(early)} finished in the first "
                                      f"window, {len(late)} in the last; {MIN_WINDOW_REQUESTS} needed in each"))
    else:
        p_early, p_late = percentile(early, 0.99), percentile(late, 0.99)
        out.append(check(name, p_late <= 1.20 * p_early,
                         f"{fmt_ms(p_early)} -> {fmt_ms(p_late)} ({p_late / p_early - 1:+.1%}) over "
                         f"{len(early)} and {len(late)} requests"))
    return out


# ---- the report ---------------------------------------------------------------------------------------


def plots(samples: list[dict], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    t = [s["t"] / 60 for s in samples]
    figures = {
        "rss.png": ("server RSS (MiB)", [("RSS", [s["rss_mib"] for s in samples])]),
        "blocks.png": ("KV blocks in use / requests", [
            ("KV blocks in use", [s["kv_blocks_in_use"] for s in samples]),
            ("requests in flight", [s["requests_in_flight"] for s in samples]),
        ]),
        "p99.png": ("milliseconds (per sample window)", [
            ("p99 TPOT", [(s["tpot_p99"] or float("nan")) * 1000 for s in samples]),
            ("p50 TPOT", [(s["tpot_p50"] or float("nan")) * 1000 for s in samples]),
            ("p99 TTFT / 10", [(s["ttft_p99"] or float("nan")) * 100 for s in samples]),
        ]),
    }  # fmt: skip
    paths = []
    for name, (ylabel, series) in figures.items():
        fig, ax = plt.subplots(figsize=(7, 3))
        for label, ys in series:
            ax.plot(t, ys, marker=".", label=label)
        ax.set_xlabel("minutes")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        fig.savefig(folder / name, dpi=90)
        plt.close(fig)
        paths.append(folder / name)
    return paths


def context() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=REPO).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if "model name" in line), platform.processor())  # fmt: skip
    return (
        f"- machine: {cpu}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
        f"{platform.system()} {platform.release()}; load average at the start {os.getloadavg()[0]:.1f}\n"
        f"- commit {commit.strip()}{' (with local changes)' if dirty.strip() else ''}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
    )


def report(config: SoakConfig, command: str, ctx: str, result: dict, plot_paths: list[Path], out: Path) -> str:
    ok = all(v["ok"] for v in result["verdicts"])
    rows = "\n".join(f"| {v['check']} | {'ok' if v['ok'] else '**FAILED**'} | {v['detail']} |" for v in result["verdicts"])
    samples = "\n".join(
        f"| {s['t']:.0f} | {s['rss_mib']:.0f} | {s['kv_blocks_in_use']:.0f} | {s['requests_in_flight']:.0f} "
        f"| {s['requests_running']:.0f} / {s['requests_waiting']:.0f} | {fmt_ms(s['ttft_p50'])} / {fmt_ms(s['ttft_p99'])} "
        f"| {fmt_ms(s['tpot_p50'])} / {fmt_ms(s['tpot_p99'])} | {sum(s['client']['completed'].values())} "
        f"| {s['client']['aborted_by_client']} | {sum(s['client']['malformed'].values())} | {s['client']['refused_429']} "
        f"| {sum(s['client']['server_errors'].values())} |"
        for s in result["samples"]
    )
    images = "\n".join(f"![{p.stem}]({p.relative_to(out.parent)})" for p in plot_paths)
    loaded = [t["tpot"] for t in result["timings"] if t["tpot"] is not None]
    return f"""# Soak: `refengine serve` under a long mixed load

Written by `make soak` (`benchmarks/soak.py`). Verdict: **{'PASSED' if ok else 'FAILED'}**
({'counts only; no RSS or TPOT thresholds' if config.counts_only else 'every check'}).

```
{command}
```

{ctx}- server: `{shlex.join(result['serve_command'])}`
- load: {config.concurrency} client loops ({config.num_slow_clients} reading slowly, 50 ms per event) for
  {config.duration_s:.0f} s; lengths from seeded lognormals shaped like ShareGPT's, scaled down 4x for a CPU
  (prompt median ~25 words, output median ~50 tokens, capped at 256); {config.abort_fraction:.0%} of streams closed
  by the client at a random point; {config.malformed_fraction:.0%} malformed requests; every {config.burst_every_s:.0f} s
  a burst of {config.capacity + config.concurrency} short requests against a capacity of {config.capacity}
  (--max-num-seqs {config.max_num_seqs} + --max-waiting-requests {config.max_waiting_requests}).

## Checks

| check | result | detail |
|---|---|---|
{rows}

## Latency under load against the unloaded figure

TPOT of one request alone on the server (median of 3, 64 tokens): {fmt_ms(result['unloaded_tpot'])}.
TPOT of the accepted requests under load (c={config.concurrency} plus bursts): p50 {fmt_ms(percentile(loaded, 0.5))},
p99 {fmt_ms(percentile(loaded, 0.99))}, over {len(loaded)} requests. A figure, not a test.

## Over time

{images}

| t (s) | RSS (MiB) | KV blocks in use | in flight | running / waiting | TTFT p50 / p99 | TPOT p50 / p99 | finished | closed by client | malformed | 429 | 5xx |
|---|---|---|---|---|---|---|---|---|---|---|---|
{samples}

Percentiles are over the requests that finished in each sample's window. The last row is taken after
the load stopped and the server went idle. Every sample's /metrics and client counts are in the JSON
(`--json`).
"""


def parse_args(argv: list[str] | None) -> tuple[SoakConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--speculative-config", default='{"method": "eagle", "num_speculative_tokens": 3}')
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=1800, help="seconds of load")
    p.add_argument("--sample-every", type=float, default=30)
    p.add_argument("--window", type=float, default=300, help="seconds: first/last windows for RSS and TPOT")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-waiting-requests", type=int, default=24)
    p.add_argument("--burst-every", type=float, default=120)
    p.add_argument("--abort-fraction", type=float, default=0.10)
    p.add_argument("--malformed-fraction", type=float, default=0.05)
    p.add_argument("--slow-clients", type=int, default=2)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--threads", type=int, default=None, help="the server's torch threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--counts-only", action="store_true", help="skip the RSS and TPOT thresholds (short runs)")
    p.add_argument("--out", type=Path, default=None, help="the markdown report (plots go next to it)")
    p.add_argument("--json", type=Path, default=None, help="every sample, timing and verdict")
    a = p.parse_args(argv)
    config = SoakConfig(
        model=a.model, speculative_config=a.speculative_config or None, concurrency=a.concurrency,
        duration_s=a.duration, sample_every_s=a.sample_every, window_s=a.window, max_num_seqs=a.max_num_seqs,
        max_waiting_requests=a.max_waiting_requests, burst_every_s=a.burst_every, abort_fraction=a.abort_fraction,
        malformed_fraction=a.malformed_fraction, num_slow_clients=min(a.slow_clients, a.concurrency),
        max_model_len=a.max_model_len, threads=a.threads, seed=a.seed, counts_only=a.counts_only,
    )  # fmt: skip
    return config, a


def main(argv: list[str] | None = None) -> int:
    config, args = parse_args(argv)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = serve_command(config, port)
    ctx = context()
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                print(f"the server exited early:\n{server.stderr.read()}", file=sys.stderr)
                return 2
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                print("the server did not start in 600 s", file=sys.stderr)
                return 2
            time.sleep(0.2)
        rng = random.Random(config.seed + 1)
        unloaded = asyncio.run(unloaded_tpot(url, rng))
        # The counters start from here: the unloaded requests are not part of the tally.
        base = scrape(url)
        load = Load(config, url)
        sampler = Sampler(url, server.pid, config.sample_every_s)
        asyncio.run(load.run(sampler))
        final_raw = settle(url)
        # Counters relative to the start of the load (the unloaded probe came first).
        final = {k: v - base.get(k, 0) if k.endswith("_total") or "_total[" in k else v for k, v in final_raw.items()}
        sampler.take(load, since=sampler.samples[-1]["t"] if sampler.samples else 0.0)
        result = {
            "config": asdict(config),
            "serve_command": cmd,
            "unloaded_tpot": unloaded,
            "verdicts": verdicts(config, load.tally, final, sampler.samples, load.recorder.timings),
            "tally": load.tally.snapshot(),
            "final_metrics": final,
            "samples": sampler.samples,
            "timings": [asdict(t) for t in load.recorder.timings],
        }
    finally:
        server.terminate()
        try:
            _, stderr = server.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            _, stderr = server.communicate()
    result["server_exit"] = server.returncode
    result["verdicts"].append(
        {"check": "the server drains and exits 0 on SIGTERM", "ok": server.returncode == 0,
         "detail": f"exit {server.returncode}" + ("" if server.returncode == 0 else f": {stderr[-2000:]}")}
    )  # fmt: skip
    for v in result["verdicts"]:
        print(f"{'ok    ' if v['ok'] else 'FAILED'} {v['check']}: {v['detail']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    if args.out:
        command = "python benchmarks/soak.py " + shlex.join(argv if argv is not None else sys.argv[1:])
        paths = plots(result["samples"], args.out.parent / args.out.stem)
        args.out.write_text(report(config, command, ctx, result, paths, args.out))
    return 0 if all(v["ok"] for v in result["verdicts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
