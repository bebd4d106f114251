"""Helpers shared by the server tests. They live here, not in conftest.py, because several test folders
have a conftest module and a plain `from conftest import ...` picks whichever was imported last."""

import contextlib
import socket
import threading
from collections.abc import Iterator

import httpx
import uvicorn

MODEL = "fake-model"
# The real engine the server tests run against: tiny-qwen3 (seeded random weights, built in
# milliseconds) with ngram drafting, so that accepted drafts reach a stream several tokens at a time.
TINY_MODEL = "tiny-qwen3"
TINY_POOL = {"max_model_len": 256, "num_blocks": 512, "block_size": 4}
TINY_SPEC = '{"method": "ngram", "num_speculative_tokens": 3}'


def tiny_engine(**engine_args):
    """The real AsyncLLM on tiny-qwen3 over TINY_POOL, served as MODEL; `engine_args` override EngineArgs.
    Imported here, not at the top: the modules that use only the fake engine need no torch."""
    from refengine.engine.async_llm import AsyncLLM
    from refengine.engine.engine_args import EngineArgs

    return AsyncLLM(EngineArgs(TINY_MODEL, **{**TINY_POOL, **engine_args}), served_model_name=MODEL)


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
