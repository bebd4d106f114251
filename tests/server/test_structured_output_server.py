"""Structured output over HTTP with the official openai client: a live server on the real engine
(tiny-qwen3, eagle with 3 speculative tokens, async scheduling), streaming, with OpenAI's response_format
and vLLM's structured_outputs; bad constraints get a 400 naming the problem and the server keeps serving."""

import json
import re

import httpx
import jsonschema
import openai
import pytest
from real_server import MODEL, metrics, serve_real, tiny_engine

from refengine.spec_decode.config import SpeculativeConfig

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 99},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "population_millions", "capital"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe a city as JSON."}]


@pytest.fixture(scope="module")
def server():
    engine = tiny_engine(speculative_config=SpeculativeConfig.from_json('{"method": "eagle", "num_speculative_tokens": 3}'))
    assert engine.engine_info.async_scheduling
    with serve_real(engine) as url:
        yield url


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def streamed_chat(oai, **kwargs) -> tuple[str, str]:
    chunks = list(oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=120, stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    (finish,) = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return text, finish


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_json_schema_streamed_with_speculation_is_valid(oai, server, temperature):
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
    text, finish = streamed_chat(oai, response_format=response_format, temperature=temperature, seed=3)
    jsonschema.validate(json.loads(text), SCHEMA)
    assert finish == "stop"
    m = metrics(server)
    assert m["vllm:spec_decode_num_draft_tokens_total"] + m["refengine:spec_decode_num_grammar_cut_tokens_total"] > 0


def test_json_object_on_completions(oai):
    r = oai.completions.create(
        model=MODEL, prompt="A JSON object:", max_tokens=120, temperature=0, extra_body={"response_format": {"type": "json_object"}}
    )
    assert isinstance(json.loads(r.choices[0].text), dict)


@pytest.mark.parametrize(
    ("structured_outputs", "check"),
    [
        ({"regex": r"[a-c]{2}-[0-9]{2}"}, lambda t: re.fullmatch(r"[a-c]{2}-[0-9]{2}", t)),
        ({"choice": ["left", "right"]}, lambda t: t in ("left", "right")),
        ({"grammar": 'start: "x" ("+" "x")* "=" NUM\nNUM: /[0-9]/'}, lambda t: re.fullmatch(r"x(\+x)*=[0-9]", t)),
        ({"json": json.dumps(SCHEMA)}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    ],
)
def test_structured_outputs_field(oai, structured_outputs, check):
    text, finish = streamed_chat(oai, temperature=0, extra_body={"structured_outputs": structured_outputs})
    assert check(text), text
    assert finish == "stop"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
         "response_format", "nonsense"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "json_schema"),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs", "regex"),
        ({"structured_outputs": {"grammar": "start: missing"}}, "structured_outputs", "missing"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
        ({"structured_outputs": {"choice": ["a"], "structural_tag": "{}"}}, "structured_outputs.structural_tag", "not permitted"),
        ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}}, "structured_outputs", "not both"),
        ({"structured_outputs": {"choice": ["a"]}, "min_tokens": 2}, "structured_outputs", "min_tokens"),
        ({"guided_json": {"type": "object"}}, "guided_json", "structured_outputs"),
    ],
)
def test_bad_constraints_get_a_400_naming_the_problem(server, oai, body, param, message):
    r = httpx.post(f"{server}/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "stream": True, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"], error
    # Still serving, structured output included.
    text, _ = streamed_chat(oai, temperature=0, extra_body={"structured_outputs": {"choice": ["ok", "fine"]}})
    assert text in ("ok", "fine")


def test_bad_schema_through_the_openai_client_is_a_bad_request(oai):
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
        )
    assert info.value.status_code == 400
