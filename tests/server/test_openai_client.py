"""The official openai client against a live server over the real engine on tiny-qwen3: chat and
completions, streaming and not, usage, errors, and an engine dying mid-stream."""

import openai
import pytest
from server_helpers import MODEL, serve_in_thread, tiny_engine

from refengine.entrypoints.app import ServerConfig, build_app

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def server(real_engine):
    with serve_in_thread(build_app(real_engine, ServerConfig(served_model_name=MODEL, api_key="k"))) as url:
        yield url, real_engine


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="k", max_retries=0)


def test_chat_non_streaming(oai):
    r = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0)
    assert r.object == "chat.completion" and r.model == MODEL
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert 1 <= r.usage.completion_tokens <= 20


def test_chat_streaming_matches_non_streaming(oai):
    kwargs = dict(model=MODEL, messages=MESSAGES, max_completion_tokens=30, temperature=0.9, seed=11)
    whole = oai.chat.completions.create(**kwargs)
    chunks = list(oai.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_completions_non_streaming_and_streaming(oai):
    kwargs = dict(
        model=MODEL,
        prompt="Once upon a time",
        max_tokens=25,
        temperature=0,
        extra_body={"ignore_eos": True, "min_tokens": 25},
    )
    whole = oai.completions.create(**kwargs)
    assert whole.usage.completion_tokens == 25
    chunks = list(oai.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == 25
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens == len("Once upon a time")


def test_continuous_usage_and_token_ids_through_extra_body(oai):
    chunks = list(
        oai.completions.create(
            model=MODEL,
            prompt="abc",
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
    )
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 12
    ids = [t for c in chunks for ch in c.choices for t in ch.model_extra.get("token_ids", [])]
    assert len(ids) == 12


def test_logprobs(oai):
    r = oai.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=5,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 5 and all(
        e.token.startswith("token_id:") and len(e.top_logprobs) == 2 for e in content
    )
    c = oai.completions.create(
        model=MODEL, prompt="x", max_tokens=4, logprobs=1, extra_body={"ignore_eos": True}
    )
    assert len(c.choices[0].logprobs.tokens) == 4 and len(c.choices[0].logprobs.top_logprobs) == 4


def test_models(oai, server):
    (card,) = oai.models.list().data
    assert card.id == MODEL and card.model_extra["max_model_len"] == server[1].max_model_len


def test_errors_map_to_the_client_exceptions(oai, server):
    with pytest.raises(openai.BadRequestError) as bad:
        oai.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=5)
    assert bad.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="nope", messages=MESSAGES)
    wrong_key = openai.OpenAI(base_url=f"{server[0]}/v1", api_key="not-k", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong_key.completions.create(model=MODEL, prompt="x")


def test_engine_death_mid_stream_raises_in_the_client():
    engine = tiny_engine(fault_after_steps=6)
    try:
        with serve_in_thread(build_app(engine, ServerConfig(served_model_name=MODEL))) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            stream = client.completions.create(
                model=MODEL, prompt="x", max_tokens=200, stream=True, extra_body={"ignore_eos": True}
            )
            num_chunks = 0
            with pytest.raises(openai.APIError, match="engine is dead: .*injected fault"):
                for _ in stream:
                    num_chunks += 1
            assert num_chunks >= 2, "the engine died mid-stream, after some output"
            with pytest.raises(openai.InternalServerError, match="engine is dead"):
                client.completions.create(model=MODEL, prompt="x", max_tokens=4)
    finally:
        engine.shutdown()
