"""Honest failure: when the engine loop raises, every request says so with a 500 naming the reason,
/health turns 503, and the server process keeps answering. The fault mid-flight needs the fake (it
must strike while exactly two requests run and one waits); a fault before any output is the real
engine's own (fault_after_steps=0)."""

import asyncio

import httpx
import pytest
from fake_engine import FakeAsyncLLM, wait_until
from server_helpers import MODEL, serve_in_thread, tiny_engine
from sse_client import parse_events

from refengine.entrypoints.app import ServerConfig, build_app

pytestmark = pytest.mark.anyio

LONG = {"model": MODEL, "max_tokens": 400, "ignore_eos": True}


@pytest.fixture
def faulty():
    engine = FakeAsyncLLM(model_name=MODEL, max_num_seqs=2, step_interval=0.003)
    with serve_in_thread(build_app(engine, ServerConfig(served_model_name=MODEL))) as url:
        yield url, engine
    engine.shutdown()


def assert_engine_dead(response: httpx.Response, reason: str) -> None:
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert error["message"] == f"engine is dead: {reason}"
    assert (error["type"], error["code"]) == ("server_error", "engine_dead")


async def until_engine_holds(engine: FakeAsyncLLM, running: int, waiting: int) -> None:
    def check() -> bool:
        stats = engine.stats()
        return (stats.num_requests_running, stats.num_requests_waiting) == (running, waiting)

    assert await asyncio.to_thread(wait_until, check)


async def test_fault_mid_flight_then_dead_engine_answers_500(faulty):
    url, engine = faulty
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        async with client.stream(
            "POST", "/v1/completions", json={**LONG, "prompt": "a", "stream": True}
        ) as started:
            assert started.status_code == 200
            lines = started.aiter_lines()
            assert (await anext(lines)).startswith('data: {"id"')
            non_streaming = asyncio.create_task(
                client.post(
                    "/v1/chat/completions", json={**LONG, "messages": [{"role": "user", "content": "b"}]}
                )
            )
            await until_engine_holds(engine, running=2, waiting=0)
            # max_num_seqs=2: this one is still queued, without output, when the engine dies.
            queued = asyncio.create_task(
                client.post("/v1/completions", json={**LONG, "prompt": "c", "stream": True})
            )
            await until_engine_holds(engine, running=2, waiting=1)
            engine.inject_fault()
            rest = "\n".join([line async for line in lines])
            whole, never_started = await asyncio.gather(non_streaming, queued)
        reason = engine.dead_reason
        assert reason is not None and reason.startswith("RuntimeError: injected fault")

        # A stream that had begun ends with an error event naming the reason, then [DONE].
        events, done = parse_events(rest)
        assert done
        assert events[-1] == {
            "error": {
                "message": f"engine is dead: {reason}",
                "type": "server_error",
                "param": None,
                "code": "engine_dead",
            }
        }
        assert_engine_dead(whole, reason)
        assert_engine_dead(never_started, reason)

        health = await client.get("/health")
        assert health.status_code == 503
        assert health.json()["error"]["message"] == f"engine is dead: {reason}"
        for path, body in [
            ("/v1/completions", {"model": MODEL, "prompt": "later", "max_tokens": 2}),
            ("/v1/completions", {"model": MODEL, "prompt": "later", "max_tokens": 2, "stream": True}),
            ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
        ]:
            assert_engine_dead(await client.post(path, json=body), reason)
        # Bad input is still the client's fault, dead engine or not.
        assert (await client.post("/v1/completions", json={"model": MODEL})).status_code == 400
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert 'refengine:engine_dead{model_name="fake-model"} 1.0' in metrics.text
        assert 'refengine:request_failure_total{model_name="fake-model"} 3.0' in metrics.text
        assert (await client.get("/v1/models")).status_code == 200


@pytest.fixture
def engine():
    engine = tiny_engine(fault_after_steps=0)
    yield engine
    engine.shutdown()


async def test_engine_dead_before_the_request_arrives(client, engine):
    first = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    reason = engine.dead_reason
    assert reason is not None and "injected fault" in reason
    assert_engine_dead(first, reason)
    response = await client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True},
    )
    assert_engine_dead(response, reason)
    assert (await client.get("/health")).status_code == 503
