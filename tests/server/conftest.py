"""Fixtures: a fake engine, the app over it, an in-process client, and a live uvicorn server."""

import contextlib
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from fake_engine import FakeAsyncLLM

from refengine.entrypoints.app import ServerConfig, build_app

MODEL = "fake-model"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def engine() -> Iterator[FakeAsyncLLM]:
    engine = FakeAsyncLLM(model_name=MODEL)
    yield engine
    engine.shutdown()


@pytest.fixture
def app(engine: FakeAsyncLLM):
    return build_app(engine, ServerConfig(served_model_name=MODEL, max_request_bytes=64 * 1024))


@pytest.fixture
async def client(app) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=10) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app) -> Iterator[str]:
    """Runs `app` under uvicorn on a free loopback port in a thread; yields the base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        with httpx.Client() as probe:
            for _ in range(500):
                if server.started:
                    break
                threading.Event().wait(0.01)
            probe.get(f"http://127.0.0.1:{port}/health").raise_for_status()
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def live_url(app) -> Iterator[str]:
    with serve_in_thread(app) as url:
        yield url
