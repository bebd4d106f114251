"""Prefix caching through the real server: usage reports the cached prompt tokens as OpenAI does,
/metrics counts queries and hits under vLLM's names, and the engine keys state the setting."""

import httpx
import pytest
from real_server import MODEL, metric_values, serve_real, tiny_engine

PROMPT = "The old lighthouse keeper wrote in his log every night, " * 3


def _complete(url: str) -> dict:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["usage"]


@pytest.mark.parametrize("enabled", [True, False])
def test_a_repeated_prompt_is_served_from_the_cache(enabled):
    with serve_real(tiny_engine(enable_prefix_caching=enabled)) as url:
        first, second = _complete(url), _complete(url)
        metrics = metric_values(httpx.get(f"{url}/metrics").text)
    prompt_tokens = first["prompt_tokens"]
    assert prompt_tokens > 32 and second["prompt_tokens"] == prompt_tokens
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    # Every full 16-token block but the one holding the last prompt token, whose logits are computed.
    cached = (prompt_tokens - 1) // 16 * 16 if enabled else 0
    assert second["prompt_tokens_details"] == {"cached_tokens": cached}
    assert metrics["vllm:prefix_cache_queries_total"] == (2 * prompt_tokens if enabled else 0)
    assert metrics["vllm:prefix_cache_hits_total"] == cached
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0  # cached blocks without owners are free
    info = [k for k in metrics if k.startswith("refengine:engine_info")]
    assert len(info) == 1 and f"[enable_prefix_caching={enabled}]" in info[0]


def test_reset_prefix_cache_makes_the_next_request_start_cold():
    """vLLM's POST /reset_prefix_cache: after it the repeated prompt finds nothing cached, and the pool is
    whole again; a repeat after that hits as before. Refused with 409 and an OpenAI-style body while a
    request holds blocks, and the cache then stays."""
    import asyncio

    with serve_real(tiny_engine()) as url:
        first, hit = _complete(url), _complete(url)
        assert hit["prompt_tokens_details"]["cached_tokens"] > 0
        reset = httpx.post(f"{url}/reset_prefix_cache", timeout=30)
        assert reset.status_code == 200, reset.text
        cold = _complete(url)
        assert cold["prompt_tokens_details"] == {"cached_tokens": 0}
        assert _complete(url)["prompt_tokens_details"] == hit["prompt_tokens_details"]

        async def reset_while_running() -> httpx.Response:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                body = {"model": MODEL, "prompt": "abc", "max_tokens": 200, "ignore_eos": True, "stream": True}
                async with client.stream("POST", "/v1/completions", json=body) as running:
                    assert running.status_code == 200
                    async for _ in running.aiter_lines():  # the request is admitted and holds its blocks
                        return await client.post("/reset_prefix_cache")

        busy = asyncio.run(reset_while_running())
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "engine_busy", busy.text
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
