"""`refengine serve`: the OpenAI-compatible server on FastAPI + uvicorn, with vLLM-style flags.

`serve_command` is the click command the `refengine` group registers. `make_serve_command` builds it
around any engine factory, so tests can run the real command line over a fake engine.
"""

import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import click

from refengine.engine.arg_utils import DEFAULT_MAX_MODEL_LEN, DTYPE_NAMES, FAULT_ENV_VAR, EngineArgs
from refengine.entrypoints.app import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_WAITING_REQUESTS,
    ServerConfig,
    build_app,
)
from refengine.entrypoints.device_options import check_device, device_options, tensor_parallel_options
from refengine.entrypoints.engine_client import EngineClient
from refengine.entrypoints.http_server import make_server
from refengine.model.config import ATTENTION_BACKENDS
from refengine.spec_decode.config import SpeculativeConfig

logger = logging.getLogger(__name__)

# Seconds requests in flight get to finish on SIGTERM/SIGINT before they are aborted.
DEFAULT_SHUTDOWN_GRACE_S = 10.0


@dataclass(frozen=True)
class ServeOptions:
    """What `refengine serve` needs besides the engine's own arguments (EngineArgs)."""

    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None  # the model id clients send; None: the --model value
    api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    log_level: str = "info"
    threads: int | None = None  # torch intra-op threads; None leaves torch's default
    max_waiting_requests: int | None = DEFAULT_MAX_WAITING_REQUESTS
    request_timeout: float | None = None
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE_S


# The flags' defaults come from these two, so `refengine serve --help` shows what the engine uses.
ENGINE_DEFAULTS = EngineArgs()
SERVE_DEFAULTS = ServeOptions()

EngineFactory = Callable[[EngineArgs, ServeOptions], EngineClient]
# Where a flag's value came from when the user gave it (not its default).
_GIVEN = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)


def _parse_speculative_config(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> SpeculativeConfig | None:
    if value is None:
        return None
    try:
        return SpeculativeConfig.from_json(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def bind(host: str, port: int) -> socket.socket:
    """Take the address before the model loads, so a busy port fails at once, in one line; uvicorn
    then serves on this very socket (no window in which another process could take the port)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def banner(engine: EngineClient, sock: socket.socket) -> str:
    """One line that says what is serving: model, format and dtype, numerics, speculation, async
    scheduling, KV pool, device, and the address."""
    info = engine.engine_info
    host, port = sock.getsockname()[:2]
    spec = "off" if info.spec_method is None else f"{info.spec_method} k={info.num_speculative_tokens}"
    return (
        f"refengine serve: model {engine.model_name} ({info.weight_format} weights, dtype {info.dtype}), numerics "
        f"{info.numerics}, spec {spec}, async {'on' if info.async_scheduling else 'off'} "
        f"({info.async_scheduling_source}), KV {info.num_blocks} blocks of {info.block_size}, prefix caching "
        f"{'on' if info.enable_prefix_caching else 'off'}, device "
        f"{info.device}, http://{host}:{port}"
    )


def run_server(engine: EngineClient, options: ServeOptions, sock: socket.socket) -> None:
    """Serves on `sock` until SIGINT/SIGTERM, then shuts the engine down."""
    config = ServerConfig(
        served_model_name=options.served_model_name or engine.model_name,
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
        port=sock.getsockname()[1],  # what uvicorn's startup line reports
        log_level=options.log_level,
        shutdown_grace=options.shutdown_grace,
    )
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal for the handler it
    # replaced. By then the server has stopped cleanly, so that handler absorbs it and the process
    # exits 0 after shutting the engine down (rather than "Aborted!" or death by SIGTERM).
    previous = {sig: signal.signal(sig, _absorb) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        engine.shutdown()
    if server.leaked_blocks:
        raise click.ClickException(f"{server.leaked_blocks} KV blocks were still in use after the drain")


def _absorb(signum: int, frame: FrameType | None) -> None:
    logger.info("stopped by signal %d", signum)


def build_async_llm(args: EngineArgs, options: ServeOptions) -> EngineClient:
    """The real engine. Imported here so that the command line does not load torch before it must."""
    from refengine.engine.async_llm import AsyncLLM
    from refengine.model.errors import ModelLoadError

    if options.threads is not None:
        import torch

        torch.set_num_threads(options.threads)
    try:
        return AsyncLLM(args)
    except ModelLoadError as e:  # a missing or unreadable model: say which, without a traceback
        raise click.ClickException(str(e)) from None


def make_serve_command(engine_factory: EngineFactory) -> click.Command:
    @click.command("serve")
    @click.option(
        "--model",
        default=ENGINE_DEFAULTS.model,
        show_default=True,
        help="smollm2 (embedded), tiny-llama or tiny-qwen3 (seeded random 8-layer test models), random:SHAPE, a .gguf file or an HF folder.",
    )
    @click.option("--host", default=SERVE_DEFAULTS.host, show_default=True)
    @click.option(
        "--port", default=SERVE_DEFAULTS.port, show_default=True, type=click.IntRange(0, 65535),
        help="0 = a free port the OS picks (the banner names it).",
    )
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
    @click.option(
        "--enable-prefix-caching/--no-enable-prefix-caching",
        default=ENGINE_DEFAULTS.enable_prefix_caching,
        show_default=True,
        help="Automatic prefix caching (vLLM's): requests reuse the KV of cached full blocks of their prefix.",
    )
    @click.option("--max-num-seqs", type=click.IntRange(min=1), default=ENGINE_DEFAULTS.max_num_seqs, show_default=True)
    @click.option(
        "--max-model-len", type=click.IntRange(min=2), default=None,
        help=f"Default: the model's context, at most {DEFAULT_MAX_MODEL_LEN}.",
    )
    @click.option(
        "--max-num-batched-tokens", type=click.IntRange(min=1), default=ENGINE_DEFAULTS.max_num_batched_tokens,
        show_default=True,
    )
    @click.option("--num-blocks", type=click.IntRange(min=1), default=None, help="KV pool size in blocks.")
    @click.option(
        "--kv-cache-memory-gib",
        type=click.FloatRange(min=0, min_open=True),
        default=ENGINE_DEFAULTS.kv_cache_memory_gib,
        show_default=True,
        help="KV pool size as a memory budget (used when --num-blocks is not given).",
    )
    @device_options
    @tensor_parallel_options
    @click.option("--block-size", type=click.IntRange(min=1), default=ENGINE_DEFAULTS.block_size, show_default=True)
    @click.option(
        "--seed", type=int, default=ENGINE_DEFAULTS.seed, show_default=True,
        help="Engine seed: a request without its own seed samples from this and its arrival order. 0 is a "
        "seed like any other.",
    )
    @click.option("--dtype", type=click.Choice(DTYPE_NAMES), default=ENGINE_DEFAULTS.dtype, show_default=True)
    @click.option(
        "--batch-invariant/--fast",
        default=ENGINE_DEFAULTS.numerics == "batch_invariant",
        show_default=True,
        help="Numerics mode.",
    )
    @click.option(
        "--attention-backend",
        type=click.Choice(ATTENTION_BACKENDS),
        default=ENGINE_DEFAULTS.attention_backend,
        show_default=True,
        help="Attention for CUDA tensors: auto is Triton when installed (the CPU always runs the reference).",
    )
    @click.option(
        "--fused-ops/--no-fused-ops",
        default=ENGINE_DEFAULTS.fused_ops,
        show_default=True,
        help="The fused Triton token-local ops for CUDA tensors.",
    )
    @click.option(
        "--skinny-gemm/--no-skinny-gemm",
        default=ENGINE_DEFAULTS.skinny_gemm,
        show_default=True,
        help="Fast numerics on a GPU: products of 1..8 float32 rows in one Triton kernel instead of cuBLAS.",
    )
    @click.option(
        "--max-request-bytes",
        type=click.IntRange(min=1),
        default=SERVE_DEFAULTS.max_request_bytes,
        show_default=True,
        help="Larger request bodies get 413.",
    )
    @click.option(
        "--fault-after-steps",
        type=click.IntRange(min=0),
        default=None,
        envvar=FAULT_ENV_VAR,
        help=f"Testing: make the runner raise after N steps; 0 = the first step raises (default: "
        f"{FAULT_ENV_VAR}, else off).",
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
        default=SERVE_DEFAULTS.max_waiting_requests,
        show_default=True,
        help="Requests that may wait behind the running batch (--max-num-seqs); past that, 429 with "
        "Retry-After. 0 = no queue: a request that finds every seat taken gets 429.",
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
        default=SERVE_DEFAULTS.shutdown_grace,
        show_default=True,
        help="On SIGTERM/SIGINT, seconds requests in flight get to finish (new ones get 503) before "
        "the rest are aborted. 0 = requests in flight are aborted at once.",
    )
    @click.option(
        "--log-level",
        type=click.Choice(["critical", "error", "warning", "info", "debug"]),
        default=SERVE_DEFAULTS.log_level,
        show_default=True,
    )
    @click.pass_context
    def serve(
        ctx: click.Context,
        model: str,
        host: str,
        port: int,
        served_model_name: str | None,
        api_key: str | None,
        speculative_config: SpeculativeConfig | None,
        async_scheduling: bool | None,
        enable_prefix_caching: bool,
        max_num_seqs: int,
        max_model_len: int | None,
        max_num_batched_tokens: int,
        num_blocks: int | None,
        kv_cache_memory_gib: float,
        device: str | None,
        cuda_graphs: bool | None,
        tensor_parallel_size: int,
        tp_invariant: bool,
        block_size: int,
        seed: int,
        dtype: str,
        batch_invariant: bool,
        attention_backend: str,
        fused_ops: bool,
        skinny_gemm: bool,
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
        if num_blocks is not None and ctx.get_parameter_source("kv_cache_memory_gib") in _GIVEN:
            raise click.UsageError("give --num-blocks or --kv-cache-memory-gib, not both")
        check_device(device, cuda_graphs)
        args = EngineArgs(
            model=model,
            numerics="batch_invariant" if batch_invariant else "fast",
            dtype=dtype,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            block_size=block_size,
            num_blocks=num_blocks,
            kv_cache_memory_gib=kv_cache_memory_gib,
            device=device,
            cuda_graphs=cuda_graphs,
            seed=seed,
            speculative_config=speculative_config,
            async_scheduling=async_scheduling,
            enable_prefix_caching=enable_prefix_caching,
            fault_after_steps=fault_after_steps,
            attention_backend=attention_backend,
            fused_ops=fused_ops,
            skinny_gemm=skinny_gemm,
            tensor_parallel_size=tensor_parallel_size,
            tp_invariant=tp_invariant,
        )
        options = ServeOptions(
            host=host,
            port=port,
            served_model_name=served_model_name,
            api_key=api_key,
            max_request_bytes=max_request_bytes,
            log_level=log_level,
            threads=threads,
            max_waiting_requests=max_waiting_requests,
            request_timeout=request_timeout,
            shutdown_grace=shutdown_grace,
        )
        sock = bind(host, port)
        try:
            engine = engine_factory(args, options)
        except ValueError as e:  # a configuration the engine refuses, with its reason
            sock.close()
            raise click.ClickException(str(e)) from None
        click.echo(banner(engine, sock), err=True)
        run_server(engine, options, sock)

    return serve


serve_command = make_serve_command(build_async_llm)
