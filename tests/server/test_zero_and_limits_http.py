"""Every limit of an OpenAI request field, at 0, 1, its documented maximum and one past it (where it
has one), and a negative value, checked where the server validates it (the app over the fake engine:
no model needed); what 0 means, written beside docs/serving.md's wording, which the test reads so that the
two cannot drift; and one end-to-end case per meaning of 0 on the real engine (tiny-qwen3), where
`refengine serve --max-waiting-requests 0` means no queue. The command-line flags' table is
tests/cli/test_zero_and_limits.py."""

import asyncio
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from real_server import metrics, serve_real, tiny_engine, wait_for_idle_pool
from server_process import REAL_SERVE, ServerProcess

from refengine.entrypoints.protocol import INT32_MAX, INT64_MAX, MAX_LOGPROBS

pytestmark = pytest.mark.anyio

PROMPT = [1, 2, 3]  # token ids: the prompt is 3 tokens whatever the tokenizer
ROOM = 512 - len(PROMPT)  # the fake engine's max_model_len less the prompt: max_tokens' maximum
# Where a value goes: a name for test ids, the endpoint, and the body it is added to.
COMPLETION = ("completions", "/v1/completions", {"prompt": PROMPT, "max_tokens": 4})
MESSAGES = {"messages": [{"role": "user", "content": "hi"}]}
CHAT = ("chat", "/v1/chat/completions", {**MESSAGES, "max_tokens": 4})
CHAT_LOGPROBS = ("chat-with-logprobs", "/v1/chat/completions", {**CHAT[2], "logprobs": True})
OK, BAD = 200, 400


@dataclass(frozen=True)
class Field:
    name: str
    zero: str  # what 0 means, as docs/serving.md's request-field list says it
    where: tuple[str, str, dict]
    cases: dict  # value -> status


FIELDS = [
    Field("max_tokens", "`max_tokens` 0 is refused (at least 1)", COMPLETION,
          {0: BAD, 1: OK, ROOM: OK, ROOM + 1: BAD, -1: BAD}),
    Field("max_completion_tokens", "`max_completion_tokens` 0 is refused (at least 1)", ("chat", "/v1/chat/completions", MESSAGES),
          {0: BAD, 1: OK, -1: BAD}),
    Field("min_tokens", "`min_tokens` 0 = no minimum (at most `max_tokens`)", COMPLETION,
          {0: OK, 1: OK, 4: OK, 5: BAD, -1: BAD}),
    Field("n", "`n` only 1", COMPLETION, {0: BAD, 1: OK, 2: BAD, -1: BAD}),
    Field("top_k", "`top_k` 0 or -1 = off", COMPLETION,
          {0: OK, 1: OK, INT32_MAX: OK, INT32_MAX + 1: BAD, -1: OK, -2: BAD}),
    Field("top_p", "`top_p` 0 is refused (1 = off)", COMPLETION, {0: BAD, 1: OK, 1.0001: BAD, -1: BAD}),
    Field("temperature", "`temperature` 0 = greedy (at most 2)", COMPLETION, {0: OK, 1: OK, 2: OK, 2.0001: BAD, -1: BAD}),
    Field("logprobs", "`logprobs` 0 = the sampled token's logprob only (at most 20)", COMPLETION,
          {0: OK, 1: OK, MAX_LOGPROBS: OK, MAX_LOGPROBS + 1: BAD, -1: BAD}),
    Field("top_logprobs", "`top_logprobs` 0 = the sampled token's logprob only (at most 20), and only with "
          "`logprobs: true`", CHAT_LOGPROBS, {0: OK, 1: OK, MAX_LOGPROBS: OK, MAX_LOGPROBS + 1: BAD, -1: BAD}),
    # Without logprobs, any top_logprobs is refused, 0 included (as OpenAI).
    Field("top_logprobs", "and only with `logprobs: true`", CHAT, {0: BAD, 1: BAD}),
    Field("seed", "`seed` 0 is a seed like any other", COMPLETION, {0: OK, 1: OK, INT64_MAX: OK, INT64_MAX + 1: BAD, -1: OK}),
    Field("timeout", "`timeout` 0 is refused (seconds, > 0)", COMPLETION, {0: BAD, 1: OK, -1: BAD}),
]
CASES = [(f, value) for f in FIELDS for value in f.cases]


def readme_fields() -> str:
    text = (Path(__file__).parents[2] / "docs" / "serving.md").read_text()
    (bullet,) = [b for b in text.split("\n- ") if b.startswith("Zero and limits of request fields")]
    return " ".join(bullet.split())


@pytest.mark.parametrize("field", FIELDS, ids=[f"{f.name}-{f.where[0]}" for f in FIELDS])
def test_readme_says_what_0_means(field):
    assert field.zero in readme_fields()


@pytest.mark.parametrize(("field", "value"), CASES, ids=[f"{f.name}={v}-{f.where[0]}" for f, v in CASES])
async def test_each_value_is_taken_or_refused_as_the_table_says(client, field, value):
    _, path, body = field.where
    response = await client.post(path, json={**body, field.name: value})
    assert response.status_code == field.cases[value], response.text
    if response.status_code == BAD:
        assert response.json()["error"]["param"] == field.name, response.text


# ---- end to end, on the real engine -------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_seat():
    """`refengine serve` on tiny-qwen3 with one seat and --max-waiting-requests 0."""
    server = ServerProcess(
        REAL_SERVE, "--model", "tiny-qwen3", "--max-model-len", "256", "--num-blocks", "64", "--threads", "1",
        "--max-num-seqs", "1", "--max-waiting-requests", "0",
    )
    try:
        yield server.url
    finally:
        server.kill()


async def test_max_waiting_requests_0_means_no_queue(one_seat):
    async with httpx.AsyncClient(base_url=one_seat, timeout=120) as client:
        body = {"prompt": "long", "max_tokens": 240, "ignore_eos": True}
        seated = asyncio.create_task(client.post("/v1/completions", json=body))
        while metrics(one_seat)["refengine:requests_in_flight"] < 1:
            await asyncio.sleep(0.005)
        refused = await client.post("/v1/completions", json={"prompt": "next", "max_tokens": 2})
        assert refused.status_code == 429, refused.text
        assert "--max-waiting-requests 0" in refused.json()["error"]["message"]
        assert (await seated).status_code == 200
        wait_for_idle_pool(one_seat)
        assert (await client.post("/v1/completions", json={"prompt": "next", "max_tokens": 2})).status_code == 200


async def test_temperature_0_is_greedy_and_top_k_0_is_off(one_seat):
    async with httpx.AsyncClient(base_url=one_seat, timeout=120) as client:

        async def ids(**fields) -> list[int]:
            body = {"prompt": "zero", "max_tokens": 12, "ignore_eos": True, "return_token_ids": True, **fields}
            response = await client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]["token_ids"]

        # Greedy is the argmax, which top_k 1 also keeps at any temperature.
        assert await ids(temperature=0) == await ids(temperature=1.5, top_k=1, seed=3)
        # top_k 0 and -1 are both off: the same seeded sample as without top_k.
        sampled = await ids(temperature=1.0, seed=4)
        assert await ids(temperature=1.0, seed=4, top_k=0) == sampled == await ids(temperature=1.0, seed=4, top_k=-1)
        assert await ids(temperature=1.0, seed=4, min_tokens=0) == sampled


async def test_logprobs_0_and_top_logprobs_0_give_the_sampled_tokens_logprob_only(one_seat):
    async with httpx.AsyncClient(base_url=one_seat, timeout=120) as client:
        completion = await client.post("/v1/completions", json={"prompt": "zero", "max_tokens": 3, "logprobs": 0})
        logprobs = completion.json()["choices"][0]["logprobs"]
        assert len(logprobs["token_logprobs"]) == 3 and logprobs["top_logprobs"] is None
        chat = {"messages": [{"role": "user", "content": "zero"}], "max_tokens": 3}
        answered = await client.post("/v1/chat/completions", json={**chat, "logprobs": True, "top_logprobs": 0})
        content = answered.json()["choices"][0]["logprobs"]["content"]
        assert len(content) == 3 and all(entry["top_logprobs"] == [] for entry in content)
        refused = await client.post("/v1/chat/completions", json={**chat, "top_logprobs": 0})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "top_logprobs"


async def test_fault_after_steps_0_fails_the_first_step():
    with serve_real(tiny_engine(fault_after_steps=0)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            response = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
    assert response.status_code == 500
    assert "injected fault at runner step 1" in response.json()["error"]["message"]
