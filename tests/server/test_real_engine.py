"""The server over the real AsyncLLM and a tiny random-weight model: a `refengine serve` subprocess
whose streams equal offline LLM.generate, aborts that return every KV block, and honest death."""

import asyncio
import signal

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_process import REAL_SERVE, ServerProcess
from sse_client import parse_events, streamed_token_ids

from refengine.engine.arg_utils import EngineArgs
from refengine.engine.async_llm import AsyncLLM
from refengine.engine.llm import LLM
from refengine.entrypoints.app import ServerConfig, build_app
from refengine.model.tiny import build_tiny_model, save_hf_folder
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig

pytestmark = pytest.mark.anyio

SPEC = '{"method": "ngram", "num_speculative_tokens": 3}'
POOL = {"num_blocks": 512, "block_size": 4, "max_model_len": 256}
PROMPTS = [f"The {i}th story begins: once upon a time, once upon a time" for i in range(8)]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model("llama", seed=3)


@pytest.fixture(scope="module")
def tiny_folder(tiny, tmp_path_factory):
    return save_hf_folder(tiny, tmp_path_factory.mktemp("tiny") / "model")


def test_serve_subprocess_streams_equal_offline_generate(tiny_folder):
    # Four seats for eight streams: half of them wait for a seat.
    pool_flags = ["--num-blocks", "512", "--block-size", "4", "--max-model-len", "256", "--max-num-seqs", "4"]
    server = ServerProcess(
        REAL_SERVE, "--model", str(tiny_folder), "--speculative-config", SPEC, *pool_flags, wait=False
    )
    try:
        # The offline reference runs while the server starts; spec off, so the test also says that
        # serving with drafts is lossless.
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        offline = LLM(str(tiny_folder), **POOL).generate(PROMPTS, params)
        server.wait_ready()

        async def one(client: httpx.AsyncClient, prompt: str) -> list[dict]:
            body = {
                "model": str(tiny_folder),
                "prompt": prompt,
                "max_tokens": 24,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "return_token_ids": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            }
            async with client.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200, await response.aread()
                events, done = parse_events((await response.aread()).decode())
            assert done
            return events

        async def run() -> list[list[dict]]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                return await asyncio.gather(*(one(client, p) for p in PROMPTS))

        for events, expected in zip(asyncio.run(run()), offline, strict=True):
            assert streamed_token_ids(events) == expected.token_ids
            usage = dict(events[-1]["usage"])
            # The prompts share their first words: a request admitted after another published them hits.
            cached = usage.pop("prompt_tokens_details")["cached_tokens"]
            assert cached % 4 == 0 and 0 <= cached < len(expected.prompt_token_ids)
            assert usage.pop("speculative_decoding")["num_spec_steps"] > 0  # the request's own drafts
            assert usage == {
                "prompt_tokens": len(expected.prompt_token_ids),
                "completion_tokens": 24,
                "total_tokens": len(expected.prompt_token_ids) + 24,
            }
            assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == expected.text
        metrics = metric_values(httpx.get(f"{server.url}/metrics").text)
        assert metrics["vllm:spec_decode_num_draft_tokens_total"] > 0
        assert metrics["refengine:kv_cache_free_blocks"] == metrics["refengine:kv_cache_total_blocks"] == 512
    finally:
        returncode, stderr = server.stop(signal.SIGINT)
    assert returncode == 0, stderr
    assert "Traceback" not in stderr


def metric_values(text: str) -> dict[str, float]:
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "position" not in s.labels
    }


def serve_tiny(tiny, **engine_kwargs):
    from server_helpers import serve_in_thread

    engine = AsyncLLM(EngineArgs(model=tiny, **{**POOL, **engine_kwargs}))
    return engine, serve_in_thread(build_app(engine, ServerConfig(served_model_name="tiny")))


async def test_fifty_aborted_streams_return_every_block(tiny):
    engine, serving = serve_tiny(
        tiny, max_num_seqs=64, num_blocks=2048, speculative_config=SpeculativeConfig.from_json(SPEC)
    )
    try:
        with serving as url:
            async with httpx.AsyncClient(
                base_url=url, timeout=60, limits=httpx.Limits(max_connections=100)
            ) as client:

                async def leave_mid_stream(i: int) -> None:
                    body = {
                        "model": "tiny",
                        "prompt": PROMPTS[i % 8],
                        "max_tokens": 200,
                        "ignore_eos": True,
                        "stream": True,
                        "seed": i,
                    }
                    async with client.stream("POST", "/v1/completions", json=body) as response:
                        assert response.status_code == 200
                        num_events = 0
                        async for line in response.aiter_lines():
                            assert line != "data: [DONE]"
                            num_events += line.startswith("data: ")
                            if num_events == 2:
                                return

                await asyncio.gather(*(leave_mid_stream(i) for i in range(50)))
                deadline = asyncio.get_running_loop().time() + 30
                while True:
                    m = metric_values((await client.get("/metrics")).text)
                    if (
                        m["refengine:kv_cache_free_blocks"] == m["refengine:kv_cache_total_blocks"]
                        and m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0
                    ):
                        break
                    assert asyncio.get_running_loop().time() < deadline, f"blocks never came back: {m}"
                    await asyncio.sleep(0.05)
                assert m["vllm:generation_tokens_total"] < 50 * 200
                ok = await client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "tiny",
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 4,
                        "ignore_eos": True,
                    },
                )
                assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
    finally:
        engine.shutdown()


async def test_runner_fault_kills_the_engine_honestly(tiny):
    engine, serving = serve_tiny(tiny, fault_after_steps=6)
    try:
        with serving as url:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                body = {"model": "tiny", "prompt": "abc", "max_tokens": 100, "ignore_eos": True}
                streamed = await client.post("/v1/completions", json={**body, "stream": True})
                assert streamed.status_code == 200
                events, done = parse_events(streamed.text)
                reason = engine.dead_reason
                assert done and reason is not None and "injected fault" in reason
                assert events[-1]["error"]["message"] == f"engine is dead: {reason}"
                assert sum(len(e["choices"][0]["text"]) > 0 for e in events[:-1]) >= 1
                health = await client.get("/health")
                assert health.status_code == 503 and reason in health.json()["error"]["message"]
                for stream in (False, True):
                    later = await client.post("/v1/completions", json={**body, "stream": stream})
                    assert later.status_code == 500
                    assert later.json()["error"]["message"] == f"engine is dead: {reason}"
                assert (await client.get("/metrics")).status_code == 200
    finally:
        engine.shutdown()


@pytest.mark.slow
@pytest.mark.model
def test_serve_smollm2_streams_a_chat_like_the_readme_curl():
    """The README's lines: `refengine serve --model smollm2`, then a streaming chat request."""
    server = ServerProcess(REAL_SERVE, "--model", "smollm2", timeout=300)
    try:
        body = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "What is speculative decoding?"}],
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
        assert response.status_code == 200
        events, done = parse_events(response.text)
        assert done and events[0]["choices"][0]["delta"]["role"] == "assistant"
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
        assert events[-1]["usage"]["completion_tokens"] <= 8
    finally:
        returncode, stderr = server.stop(signal.SIGINT)
    assert returncode == 0, stderr
