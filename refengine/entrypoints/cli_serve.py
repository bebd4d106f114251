"""`refengine serve`: the OpenAI-compatible server on FastAPI + uvicorn, with vLLM-style flags.

`serve_command` is the click command the `refengine` group registers. `make_serve_command` builds it
around any engine factory, so tests can run the real command line over a fake engine.
"""

import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import click

from refengine.entrypoints.app import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_WAITING_REQUESTS,
    ServerConfig,
    build_app,
)
from refengine.entrypoints.engine_client import EngineClient
from refengine.entrypoints.http_server import make_server
from refengine.spec_decode.config import SpeculativeConfig

logger = logging.getLogger(__name__)

FAULT_ENV_VAR = "REFENGINE_FAULT_AFTER_STEPS"
# Seconds requests in flight get to finish on SIGTERM/SIGINT before they are aborted.
DEFAULT_SHUTDOWN_GRACE_S = 10.0


@dataclass(frozen=True)
class ServeOptions:
    """Everything `refengine serve` was told; engine fields left None take the engine's defaults."""

    model: str
    host: str
    port: int
    served_model_name: str | None
    api_key: str | None
    max_request_bytes: int
    log_level: str
    numerics: str
    dtype: str
    seed: int
    speculative_config: SpeculativeConfig | None
    async_scheduling: bool | None
    max_num_seqs: int | None
    max_model_len: int | None
    max_num_batched_tokens: int | None
    num_blocks: int | None
    kv_cache_memory_gib: float | None
    block_size: int | None
    fault_after_steps: int | None
    threads: int | None = None  # torch intra-op threads; None leaves torch's default
    max_waiting_requests: int | None = DEFAULT_MAX_WAITING_REQUESTS
    request_timeout: float | None = None
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE_S


EngineFactory = Callable[[ServeOptions], EngineClient]


def _parse_speculative_config(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> SpeculativeConfig | None:
    if value is None:
        return None
    try:
        return SpeculativeConfig.from_json(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def run_server(engine: EngineClient, options: ServeOptions) -> None:
    """Serves until SIGINT/SIGTERM, then shuts the engine down."""
    config = ServerConfig(
        served_model_name=options.served_model_name or options.model,
        api_key=options.api_key,
        max_request_bytes=options.max_request_bytes,
        max_waiting_requests=options.max_waiting_requests,
        request_timeout=options.request_timeout,
    )
    app = build_app(engine, config)
    server = make_server(
        app,
        app.state.openai_server,
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        shutdown_grace=options.shutdown_grace,
    )
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal for the handler it
    # replaced. By then the server has stopped cleanly, so that handler absorbs it and the process
    # exits 0 after shutting the engine down (rather than "Aborted!" or death by SIGTERM).
    previous = {sig: signal.signal(sig, _absorb) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        engine.shutdown()
    if server.leaked_blocks:
        raise click.ClickException(f"{server.leaked_blocks} KV blocks were still in use after the drain")


def _absorb(signum: int, frame: FrameType | None) -> None:
    logger.info("stopped by signal %d", signum)


def build_async_llm(options: ServeOptions) -> EngineClient:
    """The real engine. Imported here so that `refengine --help` does not load torch."""
    from refengine.engine.async_llm import AsyncLLM
    from refengine.engine.engine_args import EngineArgs
    from refengine.model.errors import ModelLoadError

    if options.threads is not None:
        import torch

        torch.set_num_threads(options.threads)
    defaults = EngineArgs()
    args = EngineArgs(
        model=options.model,
        numerics=options.numerics,
        dtype=options.dtype,
        max_num_seqs=options.max_num_seqs or defaults.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens or defaults.max_num_batched_tokens,
        max_model_len=options.max_model_len,
        block_size=options.block_size or defaults.block_size,
        num_blocks=options.num_blocks,
        kv_cache_memory_gib=options.kv_cache_memory_gib or defaults.kv_cache_memory_gib,
        seed=options.seed,
        speculative_config=options.speculative_config,
        async_scheduling=options.async_scheduling,
        fault_after_steps=options.fault_after_steps,
    )
    try:
        return AsyncLLM(args)
    except ModelLoadError as e:  # a missing or unreadable model: say which, without a traceback
        raise click.ClickException(str(e)) from None


def make_serve_command(engine_factory: EngineFactory) -> click.Command:
    @click.command("serve")
    @click.option(
        "--model",
        default="smollm2",
        show_default=True,
        help="smollm2 (embedded), tiny-llama or tiny-qwen3 (seeded random 8-layer test models), random:SHAPE, a .gguf file or an HF folder.",
    )
    @click.option("--host", default="127.0.0.1", show_default=True)
    @click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
    @click.option("--served-model-name", default=None, help="The model id clients send (default: --model).")
    @click.option(
        "--api-key",
        default=None,
        envvar="REFENGINE_API_KEY",
        help="Require `Authorization: Bearer KEY` on /v1/*.",
    )
    @click.option(
        "--speculative-config",
        default=None,
        callback=_parse_speculative_config,
        help='vLLM-style JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 3}\'.',
    )
    @click.option(
        "--async-scheduling/--no-async-scheduling",
        default=None,
        help="Default: REFENGINE_ASYNC_SCHEDULING, else on wherever the speculative method allows it.",
    )
    @click.option("--max-num-seqs", type=click.IntRange(min=1), default=None)
    @click.option("--max-model-len", type=click.IntRange(min=2), default=None)
    @click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=None)
    @click.option("--num-blocks", type=click.IntRange(min=1), default=None, help="KV pool size in blocks.")
    @click.option(
        "--kv-cache-memory-gib",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help="KV pool size as a memory budget (used when --num-blocks is not given).",
    )
    @click.option("--block-size", type=click.IntRange(min=1), default=None)
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option(
        "--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True
    )
    @click.option("--batch-invariant/--fast", default=True, show_default=True, help="Numerics mode.")
    @click.option(
        "--max-request-bytes",
        type=click.IntRange(min=1),
        default=DEFAULT_MAX_REQUEST_BYTES,
        show_default=True,
        help="Larger request bodies get 413.",
    )
    @click.option(
        "--fault-after-steps",
        type=click.IntRange(min=0),
        default=None,
        help=f"Testing: make the runner raise after N steps (default: {FAULT_ENV_VAR}, else off).",
    )
    @click.option(
        "--threads",
        type=click.IntRange(min=1),
        default=None,
        help="torch threads for the model (default: torch's). On a 2-core machine 1 decodes faster: the "
        "server's own threads need the other core.",
    )
    @click.option(
        "--max-waiting-requests",
        type=click.IntRange(min=0),
        default=DEFAULT_MAX_WAITING_REQUESTS,
        show_default=True,
        help="Requests that may wait behind the running batch (--max-num-seqs); past that, 429 with "
        "Retry-After.",
    )
    @click.option(
        "--request-timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help="Seconds a request may run before it is aborted (default: no limit); a request's own "
        "`timeout` field can only shorten it.",
    )
    @click.option(
        "--shutdown-grace",
        type=click.FloatRange(min=0),
        default=DEFAULT_SHUTDOWN_GRACE_S,
        show_default=True,
        help="On SIGTERM/SIGINT, seconds requests in flight get to finish (new ones get 503) before "
        "the rest are aborted.",
    )
    @click.option(
        "--log-level",
        type=click.Choice(["critical", "error", "warning", "info", "debug"]),
        default="info",
        show_default=True,
    )
    def serve(
        model: str,
        host: str,
        port: int,
        served_model_name: str | None,
        api_key: str | None,
        speculative_config: SpeculativeConfig | None,
        async_scheduling: bool | None,
        max_num_seqs: int | None,
        max_model_len: int | None,
        max_num_batched_tokens: int | None,
        num_blocks: int | None,
        kv_cache_memory_gib: float | None,
        block_size: int | None,
        seed: int,
        dtype: str,
        batch_invariant: bool,
        max_request_bytes: int,
        fault_after_steps: int | None,
        threads: int | None,
        max_waiting_requests: int,
        request_timeout: float | None,
        shutdown_grace: float,
        log_level: str,
    ) -> None:
        """Serve MODEL over the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models,
        /health, /metrics)."""
        if num_blocks is not None and kv_cache_memory_gib is not None:
            raise click.UsageError("give --num-blocks or --kv-cache-memory-gib, not both")
        options = ServeOptions(
            model=model,
            host=host,
            port=port,
            served_model_name=served_model_name,
            api_key=api_key,
            max_request_bytes=max_request_bytes,
            log_level=log_level,
            numerics="batch_invariant" if batch_invariant else "fast",
            dtype=dtype,
            seed=seed,
            speculative_config=speculative_config,
            async_scheduling=async_scheduling,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            num_blocks=num_blocks,
            kv_cache_memory_gib=kv_cache_memory_gib,
            block_size=block_size,
            fault_after_steps=fault_after_steps,
            threads=threads,
            max_waiting_requests=max_waiting_requests,
            request_timeout=request_timeout,
            shutdown_grace=shutdown_grace,
        )
        try:
            engine = engine_factory(options)
        except ValueError as e:  # a configuration the engine refuses, with its reason
            raise click.ClickException(str(e)) from None
        run_server(engine, options)

    return serve


serve_command = make_serve_command(build_async_llm)
