"""Graceful shutdown of a real `refengine serve` process: on SIGTERM it drains. New requests get 503
and /health says "shutting down" (the listener stays open, so they are answered, not refused at the
socket); requests in flight finish within --shutdown-grace; the rest end with finish_reason "abort"
and an error naming the shutdown; every KV block comes back, and the process exits 0."""

import asyncio
import signal

import httpx
from real_server import MODEL, metric_values
from server_process import REAL_SERVE, ServerProcess
from sse_client import parse_events

# -v: the drain's verdict is an info log line.
VERBOSE_SERVE = [REAL_SERVE[0], "-v", *REAL_SERVE[1:]]
GRACE_S = 2


async def stream(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> list[dict]:
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        events, done = parse_events((await response.aread()).decode())
    assert done
    return events


async def in_flight(client: httpx.AsyncClient) -> float:
    return metric_values((await client.get("/metrics")).text)["refengine:requests_in_flight"]


def test_sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_0():
    server = ServerProcess(
        VERBOSE_SERVE, "--model", MODEL, "--num-blocks", "256", "--shutdown-grace", str(GRACE_S),
        "--log-level", "info",
    )

    async def run() -> tuple[list[dict], list[dict], httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            # 1000 tokens take far longer than the grace period (no step is under 2 ms); 40 fit in it.
            long = asyncio.create_task(stream(client, "a long one", 1000))
            while await in_flight(client) < 1:
                await asyncio.sleep(0.01)
            short = asyncio.create_task(stream(client, "a short one", 40))
            while await in_flight(client) < 2:
                await asyncio.sleep(0.01)
            server.proc.send_signal(signal.SIGTERM)
            while (health := await client.get("/health")).status_code == 200:
                await asyncio.sleep(0.01)
            refused = await client.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
            assert (await client.get("/metrics")).status_code == 200
            return await long, await short, health, refused

    try:
        long, short, health, refused = asyncio.run(run())
        returncode, stderr = server.proc.wait(timeout=60), server.proc.stderr.read()
    finally:
        server.kill()

    assert health.status_code == 503 and health.json()["error"]["message"] == "shutting down"
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "shutting_down"
    # The short request finished in full; the long one was cut off, and says so.
    assert [e["choices"][0]["finish_reason"] for e in short if e["choices"]][-1] == "length"
    assert short[-1]["usage"]["completion_tokens"] == 40
    error = long[-1]["error"]
    assert error["code"] == "shutting_down" and "grace period" in error["message"]
    assert long[-3]["choices"][0]["finish_reason"] == "abort"
    assert 0 < long[-2]["usage"]["completion_tokens"] < 1000
    assert returncode == 0, stderr
    assert "drained: 1 requests finished within the grace period, 1 aborted; 0 KV blocks in use" in stderr
    assert "Traceback" not in stderr
