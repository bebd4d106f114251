"""Seeds end to end, over the two public surfaces (`LLM.generate` and HTTP to `refengine serve`):
seed 0 is a seed like any other; a seeded request's tokens depend on its seed alone (not on a restart,
the batch it shares, or speculative decoding); an unseeded request's tokens follow the server's
`--seed` (invariant: a request's randomness key is its own seed if it has one, else a mix of the
engine seed and its arrival index; see refengine/request.py).

One of the servers also shows two `refengine serve` zeros end to end (the table of limits is
tests/cli/test_zero_and_limits.py): `--port 0` listens on a free port the banner names, and
`--shutdown-grace 0` aborts requests in flight at once."""

import asyncio
import signal
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest
from real_server import metric_values
from server_process import REAL_SERVE, ServerProcess
from sse_client import parse_events, streamed_token_ids

from refengine.engine.llm import LLM
from refengine.sampling_params import SamplingParams

MODEL = "tiny-qwen3"
POOL = ["--max-model-len", "256", "--num-blocks", "256", "--block-size", "16", "--threads", "1"]
NGRAM = '{"method": "ngram", "num_speculative_tokens": 3}'
# Temperature 1 over a random model: two keys give different tokens at once. A repetitive prompt makes
# ngram propose drafts that get accepted, so the spec-on server really takes multi-token steps.
PROMPT = "one two three one two three one two three one two three"
SAMPLED = {"temperature": 1.0, "max_tokens": 24, "ignore_eos": True}


def test_seed_zero_is_a_seed_in_llm_generate():
    llm = LLM(MODEL, max_model_len=256, num_blocks=128, block_size=16)
    params = {s: SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=s) for s in (0, 1)}
    first, again, other = llm.generate([PROMPT] * 3, [params[0], params[0], params[1]])
    (later,) = llm.generate([PROMPT], params[0])
    assert first.token_ids == again.token_ids == later.token_ids, "seed 0 twice gave two samples"
    assert other.token_ids != first.token_ids, "seed 0 and seed 1 gave the same sample"


def test_the_engine_seed_sets_unseeded_requests_randomness_in_async_llm():
    """The server's engine, in process: the first unseeded request of an engine made with seed 5 samples
    the same tokens in another engine with seed 5, and others with seed 6."""
    from server_helpers import tiny_engine

    from refengine.engine.outputs import GenerationRequest

    async def first_unseeded(seed: int) -> list[int]:
        engine = tiny_engine(seed=seed)
        try:
            params = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)
            deltas = [d async for d in engine.generate(GenerationRequest("r", engine.tokenizer.encode(PROMPT), params))]
        finally:
            engine.shutdown()
        return [t for d in deltas for t in d.token_ids]

    five = asyncio.run(first_unseeded(5))
    assert asyncio.run(first_unseeded(5)) == five, "two engines with seed 5 disagree"
    assert asyncio.run(first_unseeded(6)) != five, "seed 6 and seed 5 agree"


def banner_url(server: ServerProcess) -> str:
    """The address the banner line names (the server's one line on stderr before it serves)."""
    for line in server.proc.stderr:
        if line.startswith("refengine serve: "):
            return line.split()[-1]
    raise AssertionError(f"no banner; the server exited with {server.proc.wait()}")


def start(*args: str) -> ServerProcess:
    return ServerProcess(REAL_SERVE, "--model", MODEL, *POOL, *args, wait=False)


@pytest.fixture(scope="module")
def servers():
    """Three real servers, started together: `--seed 5` spec off, `--seed 5` with ngram drafting (a
    restart of the first, spec on), and `--seed 6`."""
    procs = {
        "seed5": start("--seed", "5"),
        "seed5-ngram": start("--seed", "5", "--speculative-config", NGRAM),
        # The last --port wins: 0 asks the OS for a free port.
        "seed6": start("--seed", "6", "--port", "0", "--shutdown-grace", "0"),
    }
    try:
        procs["seed6"].url = banner_url(procs["seed6"])
        for proc in procs.values():
            proc.wait_ready()
        yield procs
    finally:
        for proc in procs.values():
            proc.kill()


@dataclass
class Client:
    """Asks one server for completions and keeps what it saw of each: tokens, usage, finish reason, and
    the most tokens one streamed chunk carried."""

    url: str
    http: httpx.AsyncClient
    seen: list[dict] = field(default_factory=list)

    async def tokens(self, stream: bool = False, **fields) -> list[int]:
        body = {"model": MODEL, "prompt": PROMPT, **SAMPLED, "return_token_ids": True, **fields}
        if not stream:
            response = await self.http.post(f"{self.url}/v1/completions", json=body)
            assert response.status_code == 200, response.text
            (choice,), usage = response.json()["choices"], response.json()["usage"]
            self.seen.append({**usage, "finish_reason": choice["finish_reason"], "largest_delta": 0})
            return choice["token_ids"]
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        async with self.http.stream("POST", f"{self.url}/v1/completions", json=body) as response:
            assert response.status_code == 200
            events, done = parse_events((await response.aread()).decode())
        assert done
        choices = [c for e in events for c in e["choices"]]
        self.seen.append({
            **events[-1]["usage"],
            "finish_reason": choices[-1]["finish_reason"],
            "largest_delta": max(len(c["token_ids"]) for c in choices),
        })
        return streamed_token_ids(events)


async def session(url: str) -> dict:
    """What every server is asked, in the same order (an unseeded request's key depends on its arrival
    index): one unseeded request first, then seeded ones alone (seed 7 also streamed), then seed 7 inside
    a batch."""
    async with httpx.AsyncClient(timeout=120) as http:
        client = Client(url, http)
        unseeded = await client.tokens()
        seeds = {s: await client.tokens(seed=s) for s in (0, 1, 7)}
        zero_again = await client.tokens(seed=0)
        streamed_7 = await client.tokens(stream=True, seed=7)
        greedy = await client.tokens(temperature=0.0)
        batch = await asyncio.gather(
            client.tokens(seed=7),
            client.tokens(prompt="a different prompt", seed=3),
            client.tokens(stream=True, temperature=0.0, max_tokens=40),
            client.tokens(temperature=0.0, stop_token_ids=[greedy[5]]),
        )
    return {
        "unseeded": unseeded, "seeds": seeds, "zero_again": zero_again, "streamed_7": streamed_7,
        "batched_7": batch[0], "seen": client.seen,
    }


@pytest.fixture(scope="module")
def answers(servers):
    urls = {name: proc.url for name, proc in servers.items()}

    async def all_sessions():
        return await asyncio.gather(*(session(url) for url in urls.values()))

    return dict(zip(urls, asyncio.run(all_sessions()), strict=True))


def test_seed_zero_is_a_seed_over_http(answers):
    seeds = answers["seed5"]["seeds"]
    assert answers["seed5"]["zero_again"] == seeds[0], "seed 0 twice gave two samples"
    assert seeds[0] != seeds[1]


def test_a_seeded_request_gives_the_same_tokens_across_restarts_batches_and_spec_decoding(servers, answers):
    accepted = metric_values(httpx.get(f"{servers['seed5-ngram'].url}/metrics").text)
    # The spec-on server verified drafts and accepted some: its steps were not all one token.
    assert accepted["vllm:spec_decode_num_accepted_tokens_total"] > 0
    reference = answers["seed5"]["seeds"]
    for name, answer in answers.items():
        # A different --seed changes nothing for seeded requests.
        assert answer["seeds"] == reference, name
        assert answer["batched_7"] == reference[7], f"{name}: seed 7 in a batch differs from seed 7 alone"
        assert answer["streamed_7"] == reference[7], f"{name}: seed 7 streamed differs from seed 7 whole"


def test_serve_seed_sets_unseeded_requests_randomness(answers):
    assert answers["seed5-ngram"]["unseeded"] == answers["seed5"]["unseeded"], "two servers with --seed 5 disagree"
    assert answers["seed6"]["unseeded"] != answers["seed5"]["unseeded"], "--seed 6 and --seed 5 agree"


def test_a_serve_process_counts_what_its_clients_saw_with_multi_token_steps(servers, answers):
    """/metrics of the `refengine serve` process that drafts with ngram, against its clients' view."""
    seen = answers["seed5-ngram"]["seen"]
    m = metric_values(httpx.get(f"{servers['seed5-ngram'].url}/metrics").text)
    assert max(s["largest_delta"] for s in seen) > 1, "no streamed chunk carried an accepted draft"
    assert m["vllm:generation_tokens_total"] == sum(s["completion_tokens"] for s in seen)
    assert m["vllm:prompt_tokens_total"] == sum(s["prompt_tokens"] for s in seen)
    reasons = Counter(s["finish_reason"] for s in seen)
    assert set(reasons) == {"length", "stop"}
    for reason, count in reasons.items():
        assert m[f"vllm:request_success_total[finished_reason={reason}]"] == count


def test_serve_port_0_listens_on_the_port_its_banner_names(servers, answers):
    server = servers["seed6"]
    port = int(server.url.rsplit(":", 1)[1])
    assert port not in (0, server.port), "--port 0 did not get a port of the OS's choosing"
    assert answers["seed6"]["seeds"][0], "the server on that port answered"


def test_shutdown_grace_0_aborts_requests_in_flight_at_once(servers, answers):
    server = servers["seed6"]

    async def cut_off() -> list[str]:
        body = {"model": MODEL, "prompt": "long", "max_tokens": 240, "ignore_eos": True, "stream": True}
        async with httpx.AsyncClient(timeout=60) as client:
            async with client.stream("POST", f"{server.url}/v1/completions", json=body) as response:
                assert response.status_code == 200
                lines = response.aiter_lines()
                first = await anext(lines)
                server.proc.send_signal(signal.SIGTERM)
                return [first, *[line async for line in lines]]

    lines = asyncio.run(cut_off())
    returncode, stderr = server.proc.wait(timeout=60), server.proc.stderr.read()
    events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert '"code":"shutting_down"' in events[-2].replace(" ", ""), events[-3:]
    assert "grace period" in events[-2]
    assert returncode == 0, stderr
