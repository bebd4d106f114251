"""Every malformed request gets its 4xx with an OpenAI error body, and the server keeps serving: against
the real engine on tiny-qwen3, and the fake only for a chat template that refuses a conversation."""

import json

import httpx
import pytest
from fake_engine import FakeAsyncLLM
from server_helpers import MODEL, TINY_POOL

from refengine.entrypoints.app import ServerConfig, build_app
from refengine.model.tiny import tiny_config

VOCAB_SIZE = tiny_config("qwen3").vocab_size  # tiny-qwen3's
MAX_MODEL_LEN = TINY_POOL["max_model_len"]

pytestmark = pytest.mark.anyio

CHAT, COMP = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def engine(real_engine):
    return real_engine

MSGS = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return {"model": MODEL, "messages": MSGS, "max_tokens": 4, **fields}


def comp(**fields):
    return {"model": MODEL, "prompt": "hi", "max_tokens": 4, **fields}


def without(body: dict, key: str) -> dict:
    return {k: v for k, v in body.items() if k != key}


# (case id, path, JSON body or raw bytes, expected status, expected `param` or None for "don't care")
CASES = [
    # the body itself
    ("json-truncated", CHAT, b'{"model": "fake-model", "messages":', 400, None),
    ("json-empty", CHAT, b"", 400, None),
    ("json-array", CHAT, b"[]", 400, None),
    ("json-string", COMP, b'"hi"', 400, None),
    ("json-null", COMP, b"null", 400, None),
    ("json-trailing-garbage", COMP, json.dumps(comp()).encode() + b"}", 400, None),
    ("utf8-invalid", COMP, b'{"model": "fake-model", "prompt": "\xff\xfe"}', 400, None),
    ("utf8-lone-surrogate", COMP, b'{"model": "fake-model", "prompt": "\\ud800"}', 400, None),
    # model
    ("model-int", CHAT, chat(model=5), 400, "model"),
    ("model-list", CHAT, chat(model=[MODEL]), 400, "model"),
    ("model-unknown", CHAT, chat(model="gpt-4"), 404, "model"),
    ("model-unknown-comp", COMP, comp(model=""), 404, "model"),
    # messages
    ("messages-missing", CHAT, without(chat(), "messages"), 400, "messages"),
    ("messages-empty", CHAT, chat(messages=[]), 400, "messages"),
    ("messages-null", CHAT, chat(messages=None), 400, "messages"),
    ("messages-string", CHAT, chat(messages="hi"), 400, "messages"),
    ("messages-item-string", CHAT, chat(messages=["hi"]), 400, "messages.[0]"),
    ("messages-no-content", CHAT, chat(messages=[{"role": "user"}]), 400, "messages.[0].content"),
    ("messages-no-role", CHAT, chat(messages=[{"content": "x"}]), 400, "messages.[0].role"),
    ("messages-bad-role", CHAT, chat(messages=[{"role": "robot", "content": "x"}]), 400, "messages.[0].role"),
    ("messages-role-int", CHAT, chat(messages=[{"role": 1, "content": "x"}]), 400, "messages.[0].role"),
    (
        "messages-content-null",
        CHAT,
        chat(messages=[{"role": "user", "content": None}]),
        400,
        "messages.[0].content",
    ),
    (
        "messages-content-int",
        CHAT,
        chat(messages=[{"role": "user", "content": 5}]),
        400,
        "messages.[0].content",
    ),
    (
        "messages-content-parts-empty",
        CHAT,
        chat(messages=[{"role": "user", "content": []}]),
        400,
        "messages.[0].content",
    ),
    (
        "messages-content-image",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        400,
        "messages.[0].content",
    ),
    (
        "messages-content-part-text-int",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": 3}]}]),
        400,
        "messages.[0].content",
    ),
    (
        "messages-second-bad",
        CHAT,
        chat(messages=[*MSGS, {"role": "user", "content": {}}]),
        400,
        "messages.[1].content",
    ),
    # prompt
    ("prompt-missing", COMP, without(comp(), "prompt"), 400, "prompt"),
    ("prompt-null", COMP, comp(prompt=None), 400, "prompt"),
    ("prompt-empty", COMP, comp(prompt=""), 400, "prompt"),
    ("prompt-int", COMP, comp(prompt=5), 400, "prompt"),
    ("prompt-empty-list", COMP, comp(prompt=[]), 400, "prompt"),
    ("prompt-batch", COMP, comp(prompt=["a", "b"]), 400, "prompt"),
    ("prompt-mixed-list", COMP, comp(prompt=[1, "a"]), 400, "prompt"),
    ("prompt-negative-id", COMP, comp(prompt=[-1]), 400, "prompt"),
    ("prompt-id-over-vocab", COMP, comp(prompt=[10**6]), 400, "prompt"),
    ("prompt-id-equal-vocab", COMP, comp(prompt=[72, VOCAB_SIZE]), 400, "prompt"),
    ("prompt-id-equal-vocab-wrapped", COMP, comp(prompt=[[VOCAB_SIZE]]), 400, "prompt"),
    ("prompt-float-id", COMP, comp(prompt=[1.5]), 400, "prompt"),
    ("prompt-bool-id", COMP, comp(prompt=[True]), 400, "prompt"),
    ("prompt-object", COMP, comp(prompt={"text": "x"}), 400, "prompt"),
    ("prompt-too-long", COMP, comp(prompt="a" * 600), 400, "prompt"),
    # max_tokens / max_completion_tokens
    ("max_tokens-zero", COMP, comp(max_tokens=0), 400, "max_tokens"),
    ("max_tokens-negative", CHAT, chat(max_tokens=-5), 400, "max_tokens"),
    ("max_tokens-string", COMP, comp(max_tokens="10"), 400, "max_tokens"),
    ("max_tokens-float", CHAT, chat(max_tokens=1.5), 400, "max_tokens"),
    ("max_tokens-huge", COMP, comp(max_tokens=10**30), 400, "max_tokens"),
    ("max_tokens-over-context", CHAT, chat(max_tokens=10_000), 400, "max_tokens"),
    ("max_tokens-one-over-context", COMP, comp(prompt=[72] * (MAX_MODEL_LEN - 6), max_tokens=7), 400, "max_tokens"),
    ("max_completion_tokens-zero", CHAT, chat(max_completion_tokens=0), 400, "max_completion_tokens"),
    (
        "max_completion_tokens-conflict",
        CHAT,
        chat(max_tokens=4, max_completion_tokens=8),
        400,
        "max_completion_tokens",
    ),
    (
        "max_completion_tokens-over-context",
        CHAT,
        without(chat(max_completion_tokens=10**9), "max_tokens"),
        400,
        "max_completion_tokens",
    ),
    # temperature / top_p / top_k / seed
    ("temperature-negative", CHAT, chat(temperature=-1), 400, "temperature"),
    ("temperature-too-high", COMP, comp(temperature=3), 400, "temperature"),
    ("temperature-string", CHAT, chat(temperature="hot"), 400, "temperature"),
    ("temperature-bool", COMP, comp(temperature=True), 400, "temperature"),
    (
        "temperature-inf",
        COMP,
        b'{"model": "fake-model", "prompt": "hi", "temperature": 1e400}',
        400,
        "temperature",
    ),
    (
        "temperature-nan",
        COMP,
        b'{"model": "fake-model", "prompt": "hi", "temperature": NaN}',
        400,
        "temperature",
    ),
    ("top_p-zero", CHAT, chat(top_p=0), 400, "top_p"),
    ("top_p-over-one", COMP, comp(top_p=1.5), 400, "top_p"),
    ("top_p-list", CHAT, chat(top_p=[0.5]), 400, "top_p"),
    ("top_k-below-minus-one", COMP, comp(top_k=-2), 400, "top_k"),
    ("top_k-float", CHAT, chat(top_k=2.5), 400, "top_k"),
    ("top_k-huge", COMP, comp(top_k=10**20), 400, "top_k"),
    ("seed-string", CHAT, chat(seed="abc"), 400, "seed"),
    ("seed-huge", COMP, comp(seed=2**70), 400, "seed"),
    ("seed-float", CHAT, chat(seed=1.5), 400, "seed"),
    # stop / stop_token_ids / bad_words
    ("stop-int", CHAT, chat(stop=5), 400, "stop"),
    ("stop-int-list", COMP, comp(stop=[1, 2]), 400, "stop"),
    ("stop-empty-string", CHAT, chat(stop=""), 400, "stop"),
    ("stop-too-many", COMP, comp(stop=[f"s{i}" for i in range(100)]), 400, "stop"),
    ("stop-too-long", CHAT, chat(stop=["x" * 2000]), 400, "stop"),
    ("stop_token_ids-negative", COMP, comp(stop_token_ids=[-1]), 400, "stop_token_ids.[0]"),
    ("stop_token_ids-over-vocab", CHAT, chat(stop_token_ids=[999_999]), 400, "stop_token_ids"),
    ("stop_token_ids-equal-vocab", COMP, comp(stop_token_ids=[5, VOCAB_SIZE]), 400, "stop_token_ids"),
    ("stop_token_ids-string", COMP, comp(stop_token_ids="1"), 400, "stop_token_ids"),
    ("bad_words-empty-word", CHAT, chat(bad_words=[""]), 400, "bad_words.[0]"),
    # n / stream / stream_options
    ("n-two", CHAT, chat(n=2), 400, "n"),
    ("n-zero", COMP, comp(n=0), 400, "n"),
    ("n-string", CHAT, chat(n="1"), 400, "n"),
    ("stream-string", COMP, comp(stream="yes"), 400, "stream"),
    ("stream-int", CHAT, chat(stream=1), 400, "stream"),
    (
        "stream_options-without-stream",
        CHAT,
        chat(stream_options={"include_usage": True}),
        400,
        "stream_options",
    ),
    ("stream_options-string", COMP, comp(stream=True, stream_options="x"), 400, "stream_options"),
    (
        "stream_options-include_usage-string",
        CHAT,
        chat(stream=True, stream_options={"include_usage": "yes"}),
        400,
        "stream_options.include_usage",
    ),
    (
        "stream_options-continuous-int",
        COMP,
        comp(stream=True, stream_options={"continuous_usage_stats": 1}),
        400,
        "stream_options.continuous_usage_stats",
    ),
    # ignore_eos / min_tokens
    ("ignore_eos-string", COMP, comp(ignore_eos="true"), 400, "ignore_eos"),
    ("min_tokens-negative", CHAT, chat(min_tokens=-1), 400, "min_tokens"),
    ("min_tokens-over-max", COMP, comp(max_tokens=4, min_tokens=50), 400, "min_tokens"),
    ("min_tokens-one-over-max", COMP, comp(max_tokens=4, min_tokens=5), 400, "min_tokens"),
    ("min_tokens-float", CHAT, chat(min_tokens=1.5), 400, "min_tokens"),
    # logprobs
    ("logprobs-comp-too-many", COMP, comp(logprobs=21), 400, "logprobs"),
    ("logprobs-comp-negative", COMP, comp(logprobs=-1), 400, "logprobs"),
    ("logprobs-comp-bool", COMP, comp(logprobs=True), 400, "logprobs"),
    ("logprobs-chat-int", CHAT, chat(logprobs=5), 400, "logprobs"),
    ("top_logprobs-without-logprobs", CHAT, chat(top_logprobs=3), 400, "top_logprobs"),
    ("top_logprobs-too-many", CHAT, chat(logprobs=True, top_logprobs=50), 400, "top_logprobs"),
    (
        "return_tokens_as_token_ids-string",
        COMP,
        comp(return_tokens_as_token_ids="yes"),
        400,
        "return_tokens_as_token_ids",
    ),
    # knobs this engine does not implement are refused, not silently ignored
    ("presence_penalty", CHAT, chat(presence_penalty=1.0), 400, "presence_penalty"),
    ("frequency_penalty-string", COMP, comp(frequency_penalty="x"), 400, "frequency_penalty"),
    ("repetition_penalty", COMP, comp(repetition_penalty=1.2), 400, "repetition_penalty"),
    ("logit_bias", CHAT, chat(logit_bias={"5": 10}), 400, "logit_bias"),
    ("best_of", COMP, comp(best_of=3), 400, "best_of"),
    ("echo", COMP, comp(echo=True), 400, "echo"),
    ("suffix", COMP, comp(suffix="x"), 400, "suffix"),
    ("tools", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    ("response_format-unknown-type", CHAT, chat(response_format={"type": "yaml"}), 400, "response_format.type"),
    # size
    ("body-too-large", CHAT, chat(messages=[{"role": "user", "content": "x" * 70_000}]), 413, None),
]

# Nulls on optional fields mean "the default", as in OpenAI's API: these must succeed.
ACCEPTED = [
    (
        "null-optionals-chat",
        CHAT,
        chat(
            temperature=None,
            top_p=None,
            seed=None,
            stop=None,
            n=None,
            stream=None,
            max_completion_tokens=None,
            logprobs=None,
            top_logprobs=None,
            user=None,
        ),
    ),
    (
        "null-optionals-comp",
        COMP,
        comp(
            model=None,
            temperature=None,
            top_k=None,
            stream_options=None,
            logprobs=None,
            ignore_eos=None,
            min_tokens=None,
            presence_penalty=None,
        ),
    ),
    (
        "noop-knobs",
        CHAT,
        chat(
            presence_penalty=0,
            frequency_penalty=0.0,
            repetition_penalty=1,
            best_of=1,
            n=1,
            logit_bias={},
            tools=[],
            tool_choice="none",
            response_format={"type": "text"},
        ),
    ),
    ("unknown-field-ignored", COMP, comp(some_future_field={"x": 1})),
    ("prompt-token-ids", COMP, comp(prompt=[72, 105])),
    ("prompt-token-id-last-of-vocab", COMP, comp(prompt=[72, VOCAB_SIZE - 1])),
    ("stop_token_ids-last-of-vocab", COMP, comp(stop_token_ids=[VOCAB_SIZE - 1])),
    ("min_tokens-equal-max", COMP, comp(max_tokens=4, min_tokens=4)),
    ("max_tokens-fills-the-context", COMP, comp(prompt=[72] * (MAX_MODEL_LEN - 6), max_tokens=6)),
    ("prompt-wrapped", COMP, comp(prompt=[[72, 105]])),
    ("text-parts", CHAT, chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}]}])),
    ("top_k-off", CHAT, chat(top_k=-1, temperature=0)),
]


def test_the_table_is_big_enough():
    assert len({case[0] for case in CASES}) == len(CASES) >= 60


async def send(client: httpx.AsyncClient, path: str, body: dict | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await client.post(path, content=content, headers={"content-type": "application/json"})


def assert_error_body(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.mark.parametrize(
    ("path", "body", "status", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_malformed_request_gets_4xx(client, path, body, status, param):
    error = assert_error_body(await send(client, path, body), status)
    if param is not None:
        assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(("path", "body"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
async def test_defaults_and_no_op_values_are_accepted(client, path, body):
    response = await send(client, path, body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1


async def test_server_still_serves_after_every_bad_request(client):
    for _, path, body, status, _ in CASES:
        assert (await send(client, path, body)).status_code == status
    response = await client.post(CHAT, json=chat(max_tokens=8, ignore_eos=True))
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", CHAT, 405),
        ("GET", COMP, 405),
        ("POST", "/v1/models", 405),
        ("DELETE", "/health", 405),
        ("PUT", "/metrics", 405),
        ("POST", "/v1/embeddings", 404),
        ("GET", "/v2/models", 404),
        ("GET", "/docs", 404),
    ],
)
async def test_unknown_route_or_method(client, method, path, status):
    assert_error_body(await client.request(method, path), status)


async def test_chunked_body_over_the_limit_is_413(client):
    async def chunks():
        yield b'{"model": "fake-model", "prompt": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}'

    assert_error_body(await client.post(COMP, content=chunks()), 413)


async def test_a_chat_template_that_refuses_the_conversation_is_a_400():
    # tiny-qwen3's template renders any conversation; the fake's refuses one that starts with the
    # assistant, as real templates do (raise_exception).
    engine = FakeAsyncLLM(model_name=MODEL)
    app = build_app(engine, ServerConfig(served_model_name=MODEL))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            body = chat(messages=[{"role": "assistant", "content": "x"}])
            assert assert_error_body(await send(client, CHAT, body), 400)["param"] == "messages"
            assert (await send(client, CHAT, chat())).status_code == 200
    finally:
        engine.shutdown()


@pytest.fixture
async def keyed_client(engine):
    app = build_app(engine, ServerConfig(served_model_name=MODEL, api_key="sesame"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        yield c


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer wrong"},
        {"authorization": "Basic sesame"},
        {"authorization": "sesame"},
        {"authorization": "Bearer sesame-and-more"},
    ],
    ids=["missing", "wrong", "basic-scheme", "no-scheme", "prefix-match"],
)
async def test_api_key_is_required_on_v1(keyed_client, headers):
    for path in (CHAT, COMP):
        response = await keyed_client.post(path, json=chat() if path == CHAT else comp(), headers=headers)
        assert assert_error_body(response, 401)["type"] == "authentication_error"
    assert_error_body(await keyed_client.get("/v1/models", headers=headers), 401)


async def test_api_key_accepted_and_ops_routes_stay_open(keyed_client):
    ok = await keyed_client.post(CHAT, json=chat(), headers={"authorization": "Bearer sesame"})
    assert ok.status_code == 200
    assert (await keyed_client.get("/health")).status_code == 200
    assert (await keyed_client.get("/metrics")).status_code == 200


def test_oversized_bodies_over_a_real_socket_get_413_and_the_connection_recovers(live_url):
    def chunks():
        for _ in range(200):
            yield b"x" * 65536

    with httpx.Client(base_url=live_url, timeout=10) as client:
        for content in (b'{"prompt": "' + b"x" * 10_000_000 + b'"}', chunks()):
            assert_error_body(client.post(COMP, content=content), 413)
        assert client.post(COMP, json=comp()).status_code == 200
