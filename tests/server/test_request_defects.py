"""Defects found by hostile input (#18), each against the real `refengine serve --model tiny-qwen3`:
the completions max_tokens default, oversized headers, lone surrogate escapes, and a request that
fails while being added, which must fail alone."""

import asyncio
import socket

import httpx
import pytest
from real_server import MODEL, serve_real, tiny_engine, wait_for_idle_pool
from server_process import REAL_SERVE, ServerProcess

MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def server():
    server = ServerProcess(
        REAL_SERVE, "--model", MODEL, "--num-blocks", "128", "--max-model-len", str(MAX_MODEL_LEN)
    )
    yield server
    server.kill()


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    return error


def still_serves(url: str) -> None:
    ok = httpx.post(f"{url}/v1/completions", json={"prompt": "ok", "max_tokens": 2, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("body", [{}, {"max_tokens": None}], ids=["absent", "null"])
def test_completions_default_to_16_tokens_as_openai_and_vllm(server, body):
    response = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "Once", "ignore_eos": True, **body}, timeout=60
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 16


def test_chat_without_max_tokens_fills_the_context(server):
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "ignore_eos": True},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == MAX_MODEL_LEN


def test_headers_of_several_hundred_kb_get_431_not_a_reset(server):
    response = httpx.post(
        f"{server.url}/v1/completions",
        json={"prompt": "x", "max_tokens": 1},
        headers={"x-padding": "a" * 400_000},
        timeout=30,
    )
    error = assert_openai_error(response, 431)
    assert "headers exceed" in error["message"]
    still_serves(server.url)


def test_garbage_instead_of_http_gets_an_openai_shaped_400(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    assert httpx.Response(400, content=body).json()["error"]["code"] == "invalid_http"
    still_serves(server.url)


@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "\\ud83d x"])
def test_a_lone_surrogate_escape_is_refused_naming_the_real_problem(server, escape):
    raw = ('{"prompt": "a' + escape + 'b", "max_tokens": 2}').encode()
    response = httpx.post(
        f"{server.url}/v1/completions", content=raw, headers={"content-type": "application/json"}
    )
    error = assert_openai_error(response, 400)
    assert escape.split()[0] in error["message"] and "surrogate" in error["message"], error
    assert error["code"] == "invalid_unicode"
    # A proper pair is a character like any other.
    paired = httpx.post(
        f"{server.url}/v1/completions",
        content=b'{"prompt": "a\\ud83d\\ude00b", "max_tokens": 2}',
        headers={"content-type": "application/json"},
    )
    assert paired.status_code == 200, paired.text


# ---- request-level fault isolation --------------------------------------------------------------

POISON = [7, 7, 7, 7, 7]  # the prompt whose add_request fails


@pytest.mark.anyio
async def test_a_request_failing_at_add_request_fails_alone(monkeypatch):
    engine = tiny_engine()
    core = engine.engine.core
    add_request = core.add_request

    def faulty_add_request(request):
        # The fault strikes after the scheduler has taken the request, so undoing it is tested too.
        add_request(request)
        if list(request.prompt_token_ids) == POISON:
            raise RuntimeError("injected add_request fault")

    monkeypatch.setattr(core, "add_request", faulty_add_request)
    with serve_real(engine) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            body = {"prompt": "a long story", "max_tokens": 40, "ignore_eos": True, "stream": True}
            async with client.stream("POST", "/v1/completions", json=body) as running:
                assert running.status_code == 200
                lines = running.aiter_lines()
                assert (await anext(lines)).startswith("data: ")
                # Short timeout: an engine that dies while adding it never answers this request.
                poisoned = await client.post(
                    "/v1/completions", json={"prompt": POISON, "max_tokens": 4, "stream": True}, timeout=10
                )
                rest = [line async for line in lines if line]
            error = assert_openai_error(poisoned, 500)
            assert error["code"] == "request_failed"
            assert error["message"].startswith("request cmpl-")
            assert "RuntimeError: injected add_request fault" in error["message"]
            # The request in flight finished, and the engine lives on.
            assert rest[-1] == "data: [DONE]" and not any('"error"' in line for line in rest)
            assert (await client.get("/health")).status_code == 200
            after = await asyncio.gather(
                *(
                    client.post("/v1/completions", json={"prompt": p, "max_tokens": 3, "ignore_eos": True})
                    for p in ("one", "two", POISON)
                )
            )
            assert [r.status_code for r in after] == [200, 200, 500]
        assert engine.dead_reason is None
        m = await asyncio.to_thread(wait_for_idle_pool, url)
        assert m["refengine:request_failure_total"] == 2
