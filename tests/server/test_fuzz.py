"""No client input produces a 5xx or a hang: random JSON bodies over every request field, served by the
real engine on tiny-qwen3 (so stop strings, bad_words, logprobs and seeds run the engine's own paths)."""

import asyncio
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import MODEL, tiny_engine

from refengine.entrypoints.app import ServerConfig, build_app

FIELDS = [
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
    "stop", "stop_token_ids", "bad_words", "n", "stream", "stream_options", "ignore_eos", "min_tokens", "logprobs",
    "top_logprobs", "return_tokens_as_token_ids", "return_token_ids", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "min_p", "best_of", "use_beam_search", "logit_bias", "echo", "suffix", "tools",
    "tool_choice", "response_format", "user",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-3, max_value=70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from([MODEL, "user", "assistant", "system", "text"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(["role", "content", "type", "text", "include_usage", "continuous_usage_stats"]),
            inner,
            max_size=3,
        ),
    ),
    max_leaves=8,
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "tool"]),
        "content": st.one_of(st.text(max_size=30), values),
    }
)
bodies = st.dictionaries(st.sampled_from(FIELDS), values, max_size=8).flatmap(
    lambda body: st.fixed_dictionaries(
        {
            "messages": st.one_of(st.lists(message, max_size=3), values),
            "prompt": st.one_of(st.text(max_size=30), values),
        }
    ).map(lambda required: {**required, **body})
)


@pytest.fixture(scope="module")
def fuzz_app():
    # A short context keeps every accepted body's generation short.
    engine = tiny_engine(max_model_len=64, num_blocks=256)
    yield build_app(engine, ServerConfig(served_model_name=MODEL))
    engine.shutdown()


def post(app, path: str, content: bytes) -> httpx.Response:
    async def send() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await asyncio.wait_for(client.post(path, content=content), timeout=10)

    return asyncio.run(send())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, chat=st.booleans())
def test_random_bodies_never_get_a_5xx(fuzz_app, body, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    response = post(fuzz_app, path, json.dumps(body).encode())
    assert response.status_code < 500, (body, response.text)
    if response.status_code != 200:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@settings(max_examples=50, deadline=None)
@given(raw=st.binary(max_size=64))
def test_random_bytes_never_get_a_5xx(fuzz_app, raw):
    assert post(fuzz_app, "/v1/chat/completions", raw).status_code == 400
