"""Security basics of `refengine serve`: it listens on loopback unless told otherwise, compares API
keys in constant time, never writes a request body or a key to its logs (at debug level, through
every error path), and answers every error with an OpenAI-shaped body."""

import signal

import httpx
import psutil
import pytest
from real_server import MODEL, serve_real, tiny_engine
from server_process import REAL_SERVE, ServerProcess

from refengine.entrypoints import app as app_module

KEY = "sk-the-secret-key-4242"
WRONG_KEY = "sk-a-wrong-key-1717"
MARK = "PRIVATE-BODY-TEXT-9931"  # in request bodies and headers below (paths are logged, as by any server)


def assert_openai_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and isinstance(error["code"], str)


def test_no_body_or_key_reaches_the_logs_and_every_error_is_openai_shaped():
    server = ServerProcess(
        [REAL_SERVE[0], "-v", *REAL_SERVE[1:]],
        "--model", MODEL, "--num-blocks", "128", "--api-key", KEY, "--max-request-bytes", "4096",
        "--max-model-len", "256", "--log-level", "debug",
    )  # fmt: skip
    try:
        listening = [c.laddr for c in psutil.Process(server.proc.pid).net_connections("inet") if c.status == "LISTEN"]
        assert [a.ip for a in listening] == ["127.0.0.1"], listening

        auth = {"authorization": f"Bearer {KEY}"}
        url = f"{server.url}/v1/completions"
        ok = httpx.post(url, json={"prompt": MARK, "max_tokens": 3}, headers=auth, timeout=30)
        assert ok.status_code == 200, ok.text
        raw = {**auth, "content-type": "application/json"}
        for status, request in [
            (401, lambda: httpx.post(url, json={"prompt": MARK}, headers={"authorization": f"Bearer {WRONG_KEY}"})),
            (401, lambda: httpx.post(url, json={"prompt": MARK}, headers={"authorization": WRONG_KEY})),
            (400, lambda: httpx.post(url, content=f'{{"prompt": "{MARK}", '.encode(), headers=raw)),
            (400, lambda: httpx.post(url, json={"prompt": "x", "temperature": MARK}, headers=auth)),
            (400, lambda: httpx.post(url, content=f'{{"prompt": "{MARK}\\ud800"}}'.encode(), headers=raw)),
            (400, lambda: httpx.post(url, content=MARK.encode() + b"\xff", headers=raw)),
            (404, lambda: httpx.post(url, json={"prompt": "x", "model": MARK}, headers=auth)),
            (400, lambda: httpx.post(url, json={"prompt": MARK * 100, "max_tokens": 200}, headers=auth)),
            (413, lambda: httpx.post(url, json={"prompt": MARK * 400}, headers=auth)),
            (431, lambda: httpx.post(url, json={"prompt": "x"}, headers={**auth, "x-pad": MARK * 10_000})),
            (408, lambda: httpx.post(url, json={"prompt": MARK, "max_tokens": 200, "ignore_eos": True,
                                                "timeout": 0.01}, headers=auth, timeout=30)),
            (404, lambda: httpx.get(f"{server.url}/v1/nowhere", headers=auth)),
            (405, lambda: httpx.delete(url, headers=auth)),
        ]:  # fmt: skip
            assert_openai_error(request(), status)
        # A client that leaves mid-stream.
        body = {"prompt": MARK, "max_tokens": 100, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url, json=body, headers=auth, timeout=30) as response:
            assert response.status_code == 200
            next(response.iter_lines())
    finally:
        server.proc.send_signal(signal.SIGTERM)
        stdout, stderr = server.proc.communicate(timeout=60)
    logs = stdout + stderr
    assert server.proc.returncode == 0, logs
    assert "POST /v1/completions" in logs, "the debug logs were not captured"
    for secret in (MARK, KEY, WRONG_KEY):
        assert secret not in logs, f"{secret} was logged:\n{logs}"


@pytest.mark.anyio
async def test_the_api_key_is_compared_in_constant_time(monkeypatch):
    compared = []
    compare_digest = app_module.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return compare_digest(a, b)

    monkeypatch.setattr(app_module.hmac, "compare_digest", spy)
    with serve_real(tiny_engine(), api_key=KEY) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            for key, status in [(WRONG_KEY, 401), (KEY[:-1], 401), (KEY, 200)]:
                response = await client.get("/v1/models", headers={"authorization": f"Bearer {key}"})
                assert response.status_code == status
    assert compared == [(k.encode(), KEY.encode()) for k in (WRONG_KEY, KEY[:-1], KEY)]
