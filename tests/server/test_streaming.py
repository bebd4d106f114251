"""Streams against a live server over the real engine on tiny-qwen3 (ngram drafts): token identity with
offline LLM.generate, multi-token chunks, exact usage (final and continuous), logprobs and token ids for
cross-server comparison. How a request maps onto SamplingParams is read from the fake, which records it."""

import asyncio

import httpx
import pytest
from fake_engine import FakeAsyncLLM
from server_helpers import MODEL, TINY_MODEL, TINY_POOL, TINY_SPEC
from sse_client import parse_events, streamed_token_ids

from refengine.engine.llm import LLM
from refengine.entrypoints.app import ServerConfig, build_app
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def engine(real_engine):
    return real_engine


@pytest.fixture(scope="module")
def offline() -> LLM:
    """The same model and drafter, offline: what every stream must equal."""
    return LLM(TINY_MODEL, **TINY_POOL, speculative_config=SpeculativeConfig.from_json(TINY_SPEC))


class _Msg:
    def __init__(self, role: str, content: str) -> None:
        self.role, self.content = role, content


def chat_prompt_ids(engine, content: str) -> list[int]:
    text = engine.tokenizer.apply_chat_template([_Msg("user", content)])
    return engine.tokenizer.encode(text, add_special_tokens=False)


async def stream(client: httpx.AsyncClient, path: str, body: dict) -> tuple[list[dict], bool]:
    async with client.stream("POST", path, json={"model": MODEL, "stream": True, **body}) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        return parse_events((await response.aread()).decode())


async def test_concurrent_streams_match_the_offline_reference(live_url, engine, offline):
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
    prompt_ids = [engine.tokenizer.encode(p) if i % 2 else chat_prompt_ids(engine, p) for i, p in enumerate(prompts)]
    expected = offline.generate(prompt_ids, [SamplingParams(**kw) for kw in params])
    for (events, done), reference in zip(results, expected, strict=True):
        assert done
        assert streamed_token_ids(events) == reference.token_ids
        assert events[-1]["choices"][0]["finish_reason"] == reference.finish_reason


async def test_chunks_carry_several_tokens_and_continuous_usage_is_exact(client, engine):
    body = {
        "prompt": "abc",
        "max_tokens": 60,
        "temperature": 0,  # greedy on the random model repeats itself, so ngram drafts get accepted
        "ignore_eos": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    events, done = await stream(client, "/v1/completions", body)
    assert done
    *chunks, usage_chunk = events
    assert usage_chunk["choices"] == []
    num_prompt = len(engine.tokenizer.encode("abc"))
    spec = usage_chunk["usage"].pop("speculative_decoding")  # the request's drafts (test_metrics_exact.py)
    assert spec["num_accepted_draft_tokens"] > 0
    assert usage_chunk["usage"] == {
        "prompt_tokens": num_prompt,
        "completion_tokens": 60,
        "total_tokens": num_prompt + 60,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    sizes = [len(c["choices"][0]["token_ids"]) for c in chunks]
    assert max(sizes) > 1, "accepted drafts arrive together"
    seen = 0
    for chunk, size in zip(chunks, sizes):
        seen += size
        # The finishing chunk's usage also carries the request's drafts, as the usage chunk's does.
        assert chunk["usage"].pop("speculative_decoding", spec) == spec
        assert chunk["usage"] == {
            "prompt_tokens": num_prompt,
            "completion_tokens": seen,
            "total_tokens": num_prompt + seen,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
    text = engine.tokenizer.decode(streamed_token_ids(chunks), skip_special_tokens=True)
    assert "".join(c["choices"][0]["text"] for c in chunks) == text


async def test_chat_stream_shape(client, engine):
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
    assert events[-1]["usage"]["prompt_tokens"] == len(chat_prompt_ids(engine, "hello"))


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


async def test_logprobs_with_token_ids_as_strings(client, engine, offline):
    body = {
        "prompt": "q",
        "max_tokens": 10,
        "ignore_eos": True,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "temperature": 0,
    }
    whole = (await client.post("/v1/completions", json={"model": MODEL, **body})).json()
    (expected,) = offline.generate(
        [engine.tokenizer.encode("q")], SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.0)
    )
    logprobs = whole["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in expected.token_ids]
    assert len(logprobs["token_logprobs"]) == 10 and logprobs["top_logprobs"] is None
    assert all(lp <= 0.0 for lp in logprobs["token_logprobs"])
    assert logprobs["text_offset"][0] == 0 and logprobs["text_offset"] == sorted(logprobs["text_offset"])


async def test_chat_top_logprobs(client):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "q"}],
        "max_tokens": 6,
        "temperature": 0,  # greedy: the chosen token is the top one
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


async def test_request_maps_onto_sampling_params():
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
    fake = FakeAsyncLLM(model_name=MODEL)
    try:
        app = build_app(fake, ServerConfig(served_model_name=MODEL))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            assert (await client.post("/v1/completions", json=body)).status_code == 200
    finally:
        fake.shutdown()
    (seen,) = fake.requests_seen
    params = seen.sampling_params
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
    assert seen.logprobs is None


async def test_max_tokens_defaults_to_the_rest_of_the_context(client, engine):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "p"}], "ignore_eos": True}
    response = await client.post("/v1/chat/completions", json=body)
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == len(chat_prompt_ids(engine, "p"))
    assert usage["total_tokens"] == engine.max_model_len and response.json()["choices"][0]["finish_reason"] == "length"


async def test_models_health_and_metrics(client, engine):
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == engine.max_model_len
    assert (await client.get("/health")).status_code == 200
