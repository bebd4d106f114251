"""Streams against a live server: token identity with the offline reference, multi-token chunks,
exact usage (final and continuous), logprobs and token ids for cross-server comparison."""

import asyncio

import httpx
import pytest
from fake_engine import FakeTokenizer, reference_output
from server_helpers import MODEL
from sse_client import parse_events, streamed_token_ids

from refengine.sampling_params import SamplingParams

pytestmark = pytest.mark.anyio

TOKENIZER = FakeTokenizer()


class _Msg:
    def __init__(self, role: str, content: str) -> None:
        self.role, self.content = role, content


def chat_prompt_ids(content: str) -> list[int]:
    return TOKENIZER.encode(TOKENIZER.apply_chat_template([_Msg("user", content)]), add_special_tokens=False)


async def stream(client: httpx.AsyncClient, path: str, body: dict) -> tuple[list[dict], bool]:
    async with client.stream("POST", path, json={"model": MODEL, "stream": True, **body}) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        return parse_events((await response.aread()).decode())


async def test_concurrent_streams_match_the_offline_reference(live_url):
    prompts = [f"prompt number {i}: tell me something" for i in range(8)]
    params = [dict(max_tokens=40 + 5 * i, temperature=0.0 if i % 2 else 0.8, seed=i) for i in range(8)]
    async with httpx.AsyncClient(base_url=live_url, timeout=30) as client:
        results = await asyncio.gather(
            *[
                stream(client, "/v1/completions", {"prompt": p, "return_token_ids": True, **kw})
                if i % 2
                else stream(
                    client,
                    "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": p}], "return_token_ids": True, **kw},
                )
                for i, (p, kw) in enumerate(zip(prompts, params))
            ]
        )
    for i, (events, done) in enumerate(results):
        assert done
        prompt_ids = TOKENIZER.encode(prompts[i]) if i % 2 else chat_prompt_ids(prompts[i])
        expected, reason = reference_output(prompt_ids, SamplingParams(**params[i]))
        assert streamed_token_ids(events) == expected
        assert events[-1]["choices"][0]["finish_reason"] == reason


async def test_chunks_carry_several_tokens_and_continuous_usage_is_exact(client):
    body = {
        "prompt": "abc",
        "max_tokens": 60,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    events, done = await stream(client, "/v1/completions", body)
    assert done
    *chunks, usage_chunk = events
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 3, "completion_tokens": 60, "total_tokens": 63}
    sizes = [len(c["choices"][0]["token_ids"]) for c in chunks]
    assert max(sizes) > 1, "accepted drafts arrive together"
    seen = 0
    for chunk, size in zip(chunks, sizes):
        seen += size
        assert chunk["usage"] == {"prompt_tokens": 3, "completion_tokens": seen, "total_tokens": 3 + seen}
    assert "".join(c["choices"][0]["text"] for c in chunks) == TOKENIZER.decode(streamed_token_ids(chunks))


async def test_chat_stream_shape(client):
    body = {
        "messages": [{"role": "user", "content": "hello"}],
        "max_completion_tokens": 12,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    events, done = await stream(client, "/v1/chat/completions", body)
    assert done
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" and e["model"] == MODEL for e in events)
    assert len({e["id"] for e in events}) == 1
    content_chunks = events[1:-1]
    assert all("role" not in c["choices"][0]["delta"] for c in content_chunks)
    assert all("usage" not in c for c in events[:-1]), "usage only on the last chunk without continuous stats"
    assert [c["choices"][0]["finish_reason"] for c in content_chunks][-1] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 12
    assert events[-1]["usage"]["prompt_tokens"] == len(chat_prompt_ids("hello"))


async def test_stream_without_usage_option_has_no_usage_chunk(client):
    events, done = await stream(
        client, "/v1/completions", {"prompt": "x", "max_tokens": 5, "ignore_eos": True}
    )
    assert done and all("usage" not in e for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "length"


async def test_non_streaming_equals_streaming(client):
    base = {
        "model": MODEL,
        "prompt": "same prompt",
        "max_tokens": 30,
        "temperature": 0.7,
        "seed": 3,
        "return_token_ids": True,
    }
    whole = (await client.post("/v1/completions", json=base)).json()
    events, _ = await stream(client, "/v1/completions", {k: v for k, v in base.items() if k != "model"})
    choice = whole["choices"][0]
    assert choice["token_ids"] == streamed_token_ids(events)
    assert choice["text"] == "".join(e["choices"][0]["text"] for e in events)
    assert whole["usage"]["completion_tokens"] == len(choice["token_ids"])
    assert whole["object"] == "text_completion" and whole["model"] == MODEL


async def test_logprobs_with_token_ids_as_strings(client):
    body = {
        "prompt": "q",
        "max_tokens": 10,
        "ignore_eos": True,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "temperature": 0,
    }
    whole = (await client.post("/v1/completions", json={"model": MODEL, **body})).json()
    expected, _ = reference_output(
        TOKENIZER.encode("q"), SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.0)
    )
    logprobs = whole["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in expected]
    assert len(logprobs["token_logprobs"]) == 10 and logprobs["top_logprobs"] is None
    assert logprobs["text_offset"] == list(range(10))  # one character per toy token


async def test_chat_top_logprobs(client):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "q"}],
        "max_tokens": 6,
        "ignore_eos": True,
        "logprobs": True,
        "top_logprobs": 3,
    }
    whole = (await client.post("/v1/chat/completions", json=body)).json()
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == 6
    for entry in content:
        assert len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry["bytes"] == list(entry["token"].encode())
    no_logprobs = await client.post(
        "/v1/chat/completions", json={**body, "logprobs": False, "top_logprobs": None}
    )
    assert no_logprobs.json()["choices"][0]["logprobs"] is None


async def test_request_maps_onto_sampling_params(client, engine):
    body = {
        "model": MODEL,
        "prompt": "p",
        "max_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": -1,
        "seed": -7,
        "stop": "zz",
        "stop_token_ids": [5],
        "ignore_eos": True,
        "min_tokens": 2,
        "bad_words": ["no"],
    }
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    params = engine.requests_seen[-1].sampling_params
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.seed) == (
        9,
        0.5,
        0.9,
        0,
        -7,
    )
    assert (params.stop, params.stop_token_ids, params.ignore_eos, params.min_tokens) == (
        ["zz"],
        [5],
        True,
        2,
    )
    assert params.bad_words == ["no"]
    assert engine.requests_seen[-1].logprobs is None


async def test_max_tokens_defaults_to_the_rest_of_the_context(client, engine):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "p"}], "ignore_eos": True}
    response = await client.post("/v1/chat/completions", json=body)
    num_prompt = len(chat_prompt_ids("p"))
    assert engine.requests_seen[-1].sampling_params.max_tokens == engine.max_model_len - num_prompt
    assert response.json()["usage"]["total_tokens"] == engine.max_model_len


async def test_models_health_and_metrics(client, engine):
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == engine.max_model_len
    assert (await client.get("/health")).status_code == 200
