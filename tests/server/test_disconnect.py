"""A client that goes away aborts its request: the KV pool fills back up and the server still serves.
Over the fake, whose fixed step interval keeps requests generating or queued while their clients leave
(fifty streams aborted on the real engine: test_real_engine.py)."""

import asyncio

import httpx
import pytest
from fake_engine import FakeAsyncLLM
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import MODEL, serve_in_thread

from refengine.entrypoints.app import ServerConfig, build_app

pytestmark = pytest.mark.anyio


def read_metrics(text: str) -> dict[str, float]:
    """Sample name -> value, for the unlabelled-by-position samples."""
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "position" not in s.labels
    }


async def pool_state(client: httpx.AsyncClient) -> dict[str, float]:
    return read_metrics((await client.get("/metrics")).text)


async def wait_for_idle_pool(client: httpx.AsyncClient, timeout: float = 10.0) -> dict[str, float]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        m = await pool_state(client)
        idle = m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
        if idle and m["refengine:kv_cache_free_blocks"] == m["refengine:kv_cache_total_blocks"]:
            return m
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"pool never drained: {m}")
        await asyncio.sleep(0.02)


def long_request(i: int, chat: bool) -> tuple[str, dict]:
    common = {"model": MODEL, "stream": True, "max_tokens": 400, "ignore_eos": True, "seed": i}
    if chat:
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": f"story {i}"}]}
    return "/v1/completions", {**common, "prompt": f"story {i}"}


async def post(client: httpx.AsyncClient, path: str, body: dict) -> httpx.Response:
    return await client.post(path, json=body)


@pytest.fixture
def roomy_url():
    engine = FakeAsyncLLM(model_name=MODEL, max_num_seqs=64, num_blocks=2048, step_interval=0.005)
    with serve_in_thread(build_app(engine, ServerConfig(served_model_name=MODEL))) as url:
        yield url, engine
    engine.shutdown()


async def test_fifty_streams_aborted_mid_generation_free_the_pool(roomy_url):
    url, engine = roomy_url
    limits = httpx.Limits(max_connections=100)

    async def read_a_little_then_leave(client: httpx.AsyncClient, i: int) -> int:
        path, body = long_request(i, chat=i % 2 == 0)
        async with client.stream("POST", path, json=body) as response:
            assert response.status_code == 200
            num_events = 0
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    assert line != "data: [DONE]", "the stream ended before the client left"
                    num_events += 1
                    if num_events == 3:
                        return num_events  # leaving the block closes the connection mid-stream
        raise AssertionError("stream ended early")

    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        busy = await pool_state(client)
        assert busy["refengine:kv_cache_free_blocks"] == busy["refengine:kv_cache_total_blocks"]
        await asyncio.gather(*[read_a_little_then_leave(client, i) for i in range(50)])
        generated_at_abort = (await pool_state(client))["vllm:generation_tokens_total"]
        assert generated_at_abort < 50 * 400, "the streams did not all run to completion"
        await wait_for_idle_pool(client)
        # Nothing keeps generating for the departed clients.
        await asyncio.sleep(0.1)
        assert (await pool_state(client))["vllm:generation_tokens_total"] < 50 * 400
        ok = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "still here", "max_tokens": 5, "ignore_eos": True},
        )
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 5
    assert len(engine.requests_seen) == 51


@pytest.fixture
def one_seat_url():
    engine = FakeAsyncLLM(model_name=MODEL, max_num_seqs=1, step_interval=0.005)
    with serve_in_thread(build_app(engine, ServerConfig(served_model_name=MODEL))) as url:
        yield url, engine
    engine.shutdown()


async def test_clients_leaving_while_queued_or_waiting_non_streamed_are_aborted(one_seat_url):
    url, engine = one_seat_url
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        path, body = long_request(0, chat=False)
        async with client.stream("POST", path, json=body) as running:
            assert running.status_code == 200
            # Queued behind the running request: no headers yet; the clients give up waiting.
            queued = [
                asyncio.create_task(post(client, *long_request(i, chat=i % 2 == 0))) for i in range(1, 4)
            ]
            non_streamed = [
                asyncio.create_task(
                    client.post("/v1/completions", json={**long_request(i, False)[1], "stream": False})
                )
                for i in range(4, 6)
            ]
            await asyncio.sleep(0.2)
            assert (await pool_state(client))["vllm:num_requests_waiting"] == 5
            for task in queued + non_streamed:
                task.cancel()
            await asyncio.gather(*queued, *non_streamed, return_exceptions=True)
            deadline = asyncio.get_running_loop().time() + 5
            while (await pool_state(client))["vllm:num_requests_waiting"] != 0:
                assert asyncio.get_running_loop().time() < deadline, "queued requests were not aborted"
                await asyncio.sleep(0.02)
        await wait_for_idle_pool(client)
        ok = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert ok.status_code == 200
