"""`vllm:generation_tokens_total` equals the completion tokens the server reported to its clients
(#16), with eagle drafts (several tokens per step, async scheduling), streamed and whole, chat and
completions, stop strings cutting a step short."""

import asyncio

import httpx
import pytest
from real_server import serve_real, tiny_engine, wait_for_idle_pool
from sse_client import parse_events

from refengine.spec_decode.config import SpeculativeConfig

pytestmark = pytest.mark.anyio

EAGLE = SpeculativeConfig.from_json('{"method": "eagle", "num_speculative_tokens": 3}')


async def completion_tokens(client: httpx.AsyncClient, i: int) -> int:
    chat = i % 2 == 0
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"max_tokens": 10 + 7 * i, "ignore_eos": i % 3 != 0, "temperature": 0.0 if i % 4 else 0.8, "seed": i}
    body |= {"messages": [{"role": "user", "content": f"tell story {i}"}]} if chat else {"prompt": f"story {i}"}
    if i % 5 == 1:
        body["stop"] = ["e", " "]
    if i % 2:
        async with client.stream(
            "POST", path, json={**body, "stream": True, "stream_options": {"include_usage": True}}
        ) as response:
            assert response.status_code == 200
            events, done = parse_events((await response.aread()).decode())
        assert done
        return events[-1]["usage"]["completion_tokens"]
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()["usage"]["completion_tokens"]


async def test_generation_tokens_total_equals_the_completion_tokens_reported_to_clients():
    with serve_real(tiny_engine(speculative_config=EAGLE)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            reported = await asyncio.gather(*(completion_tokens(client, i) for i in range(12)))
        m = wait_for_idle_pool(url)
    assert m["vllm:spec_decode_num_accepted_tokens_total"] >= 0 and m["vllm:spec_decode_num_drafts_total"] > 0
    assert sum(reported) > 12
    assert m["vllm:generation_tokens_total"] == sum(reported)
