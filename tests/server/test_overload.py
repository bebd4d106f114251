"""Overload and deadlines on the real engine: past the waiting-queue bound new requests get 429 with
Retry-After while every accepted request completes; a request past its deadline is aborted with a
clear error and its KV blocks come back."""

import asyncio

import httpx
import pytest
from real_server import metrics, serve_real, tiny_engine, wait_for_idle_pool
from sse_client import parse_events

pytestmark = pytest.mark.anyio

# With 2 seats, four of these take 460 engine steps: the refusals come long before they end.
LONG = {"max_tokens": 230, "ignore_eos": True}


async def read_stream(client: httpx.AsyncClient, body: dict) -> list[dict]:
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        events, done = parse_events((await response.aread()).decode())
    assert done
    return events


async def test_past_the_waiting_bound_new_requests_get_429_and_accepted_ones_complete():
    # Capacity: 2 running + 2 waiting.
    with serve_real(tiny_engine(max_num_seqs=2), max_waiting_requests=2) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            accepted = [
                asyncio.create_task(
                    read_stream(client, {"prompt": f"story {i}", **LONG, "stream_options": {"include_usage": True}})
                )
                for i in range(4)
            ]
            while metrics(url)["refengine:requests_in_flight"] < 4:
                assert not any(task.done() for task in accepted)
                await asyncio.sleep(0.01)
            refused = await asyncio.gather(
                *(
                    client.post(path, json=body)
                    for path, body in [
                        ("/v1/completions", {"prompt": "more", **LONG}),
                        ("/v1/completions", {"prompt": "more", **LONG, "stream": True}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "more"}], **LONG}),
                    ]
                )
            )
            for response in refused:
                assert response.status_code == 429, response.text
                assert response.headers["retry-after"] == "1"
                error = response.json()["error"]
                assert error["code"] == "queue_full" and "--max-waiting-requests 2" in error["message"]
            for events in await asyncio.gather(*accepted):
                assert events[-1]["usage"]["completion_tokens"] == 230
                assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
            m = wait_for_idle_pool(url)
            assert m["refengine:request_rejected_total[reason=queue_full]"] == 3
            assert m["vllm:request_success_total[finished_reason=length]"] == 4
            # The seats are free again.
            again = await client.post("/v1/completions", json={"prompt": "again", "max_tokens": 2})
            assert again.status_code == 200


async def test_a_request_past_its_deadline_is_aborted_with_a_clear_error_and_frees_its_kv():
    # No step of this engine takes under a millisecond: 230 tokens never fit in 50 ms, nor 1000 in 1.5 s,
    # while the first of them comes well within 1.5 s.
    endless = {"max_tokens": 230, "ignore_eos": True}
    with serve_real(tiny_engine(max_model_len=1024), request_timeout=30) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            whole = await client.post("/v1/completions", json={"prompt": "a", "timeout": 0.05, **endless})
            assert whole.status_code == 408, whole.text
            error = whole.json()["error"]
            assert error["code"] == "request_timeout"
            assert "did not finish within its timeout of 0.05 s" in error["message"]

            body = {
                "messages": [{"role": "user", "content": "b"}],
                "timeout": 1.5,
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": 1000,
                "ignore_eos": True,
            }
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                events, done = parse_events((await response.aread()).decode())
            assert done
            assert events[-1]["error"]["code"] == "request_timeout"
            usage = events[-2]["usage"]
            assert 0 < usage["completion_tokens"] < 1000
            assert events[-3]["choices"][0]["finish_reason"] == "abort"
            m = wait_for_idle_pool(url)
            assert m["refengine:request_aborted_total[reason=timeout]"] == 2
            assert m["vllm:generation_tokens_total"] < 230 + 1000


async def test_the_server_request_timeout_caps_every_request():
    with serve_real(tiny_engine(), request_timeout=0.05) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            for extra in ({}, {"timeout": 600}):
                response = await client.post(
                    "/v1/completions", json={"prompt": "a", "max_tokens": 230, "ignore_eos": True, **extra}
                )
                assert response.status_code == 408, response.text
        wait_for_idle_pool(url)
