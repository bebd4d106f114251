"""The real engine (AsyncLLM over tiny-qwen3, a seeded random 8-layer model) behind the real app and
HTTP server, in this process: for tests that need to reach inside (inject a fault, read the pool)."""

import contextlib
import threading
import time
from collections.abc import Iterator

import httpx
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import free_port

from refengine.engine.async_llm import AsyncLLM
from refengine.engine.engine_args import EngineArgs
from refengine.entrypoints.app import ServerConfig, build_app
from refengine.entrypoints.http_server import make_server

MODEL = "tiny-qwen3"
# A small pool: the tests look at every block of it.
POOL = {"num_blocks": 256, "block_size": 16, "max_model_len": 256}


def tiny_engine(**engine_kwargs) -> AsyncLLM:
    return AsyncLLM(EngineArgs(model=MODEL, **{**POOL, **engine_kwargs}))


@contextlib.contextmanager
def serve_real(engine: AsyncLLM, **config_kwargs) -> Iterator[str]:
    """Serves `engine` on a free loopback port in a thread, through the server `refengine serve`
    uses; yields the base URL. The engine is shut down afterwards."""
    app = build_app(engine, ServerConfig(served_model_name=MODEL, **config_kwargs))
    port = free_port()
    server = make_server(
        app, app.state.openai_server, host="127.0.0.1", port=port, log_level="warning", shutdown_grace=5
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.01)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        engine.shutdown()


def metric_values(text: str) -> dict[str, float]:
    """Sample name (with its labels other than model_name) -> value."""
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "model_name"}
            key = sample.name + "".join(f"[{k}={v}]" for k, v in sorted(labels.items()))
            values[key] = sample.value
    return values


def metrics(url: str) -> dict[str, float]:
    return metric_values(httpx.get(f"{url}/metrics", timeout=10).text)


def wait_for_idle_pool(url: str, timeout: float = 60.0) -> dict[str, float]:
    """Waits until the engine holds no request and every KV block is free; fails naming the state."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        if (
            m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0
            and m["refengine:kv_cache_free_blocks"] == m["refengine:kv_cache_total_blocks"]
            and m["refengine:requests_in_flight"] == 0
        ):
            return m
        assert time.monotonic() < deadline, f"the pool never drained: {m}"
        time.sleep(0.05)
