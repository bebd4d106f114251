"""The load: client loops sending a seeded mix of requests, and what each request's client saw."""

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field

import httpx

from ladder.sse import SSEParser

from .config import SoakConfig

MAX_OUTPUT_TOKENS = 256
CHAT_TEMPLATE_TOKENS = 64  # room left for the chat template around the prompt
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
            # SSE lines end at CR, LF or CRLF only: httpx's aiter_lines also splits at U+2028, U+0085 and
            # the like, which a completion's text may hold raw inside one JSON event.
            parser = SSEParser()
            async for chunk in response.aiter_bytes():
                for data in parser.feed(chunk):
                    if data == b"[DONE]":
                        continue
                    event = json.loads(data)
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

    async def guarded(self, work: Coroutine) -> None:
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
        self.credit: Counter = Counter()  # see due()
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

    def due(self, variant: str, fraction: float) -> bool:
        """Exactly `fraction` of the calls for `variant`, evenly spread (not drawn at random), so a
        short run sees every variant of the mix."""
        self.credit[variant] += fraction
        if self.credit[variant] >= 1:
            self.credit[variant] -= 1
            return True
        return False

    # ---- the loops -----------------------------------------------------------------------------

    async def client_loop(self, client: httpx.AsyncClient, slow: bool) -> None:
        while time.monotonic() < self.stop_at:
            if not slow and self.due("malformed", self.config.malformed_fraction):
                await self.recorder.guarded(self.recorder.malformed(client, self.rng))
                continue
            path, body = self.request()
            abort_after = None
            if not slow and self.due("abort", self.config.abort_fraction):
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

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=self.url, timeout=600, limits=limits) as client:
            slow = [True] * self.config.num_slow_clients + [False] * (self.config.concurrency - self.config.num_slow_clients)
            await asyncio.gather(*(self.client_loop(client, s) for s in slow), self.burst_loop(client))
