"""Fixtures: a fake engine, the app over it, an in-process client, and a live uvicorn server; and the
real engine on tiny-qwen3, which a test module puts in the fake's place by overriding `engine` with it."""

from collections.abc import Iterator

import httpx
import pytest
from fake_engine import FakeAsyncLLM
from server_helpers import MODEL, TINY_MODEL, TINY_POOL, TINY_SPEC, serve_in_thread

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
    # Imported here: the modules that use only the fake engine need no torch.
    from refengine.engine.async_llm import AsyncLLM
    from refengine.engine.engine_args import EngineArgs
    from refengine.spec_decode.config import SpeculativeConfig

    spec = SpeculativeConfig.from_json(TINY_SPEC)
    engine = AsyncLLM(EngineArgs(TINY_MODEL, **TINY_POOL, speculative_config=spec), served_model_name=MODEL)
    yield engine
    engine.shutdown()
