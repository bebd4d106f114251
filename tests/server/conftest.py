"""Fixtures: a fake engine, the app over it, an in-process client, and a live uvicorn server; and the
real engine on tiny-qwen3, which a test module puts in the fake's place by overriding `engine` with it."""

from collections.abc import Iterator

import httpx
import pytest
from fake_engine import FakeAsyncLLM
from server_helpers import MODEL, TINY_SPEC, serve_in_thread, tiny_engine

from refengine.entrypoints.app import ServerConfig, build_app


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


@pytest.fixture
def live_url(app) -> Iterator[str]:
    with serve_in_thread(app) as url:
        yield url


@pytest.fixture(scope="module")
def real_engine():
    from refengine.spec_decode.config import SpeculativeConfig

    engine = tiny_engine(speculative_config=SpeculativeConfig.from_json(TINY_SPEC))
    yield engine
    engine.shutdown()
