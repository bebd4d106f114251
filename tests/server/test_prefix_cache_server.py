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
