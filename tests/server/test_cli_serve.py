"""`refengine serve` end to end: a real server subprocess on tiny-qwen3 with fault injection passed
through by flag or environment, the process surviving its engine; and the flag parsing. (Concurrent
streams through a serve subprocess: test_real_engine.py.)"""

import json
import re
import signal
import socket
import subprocess

import httpx
import pytest
from click.testing import CliRunner
from server_helpers import TINY_MODEL, free_port
from server_process import REAL_SERVE, ServerProcess

from refengine.engine.arg_utils import EngineArgs
from refengine.entrypoints.cli_serve import ServeOptions, make_serve_command

SPEC = '{"method": "ngram", "num_speculative_tokens": 3}'


@pytest.mark.parametrize("how", ["env", "flag"])
def test_fault_injection_is_passed_through_and_the_process_survives(how):
    args, env = ("--fault-after-steps", "5"), {}
    if how == "env":
        args, env = (), {"REFENGINE_FAULT_AFTER_STEPS": "5"}
    server = ServerProcess(REAL_SERVE, "--model", TINY_MODEL, *args, env=env)
    try:
        body = {"model": TINY_MODEL, "prompt": "x", "max_tokens": 100, "ignore_eos": True}
        first = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
        assert first.status_code == 500
        reason = first.json()["error"]["message"]
        # Five steps run; the sixth raises.
        assert reason.startswith("engine is dead: ") and "injected fault at runner step 6" in reason
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503 and health.json()["error"]["message"] == reason
        later = httpx.post(f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=30)
        assert later.status_code == 500 and later.json()["error"]["message"] == reason
        assert server.proc.poll() is None, "the process stays up"
    finally:
        returncode, stderr = server.stop(signal.SIGTERM)
    assert returncode == 0, stderr


class Captured(Exception):
    pass


def _no_engine(engine_args: EngineArgs, options: ServeOptions):
    raise AssertionError("--help must not build an engine")


def parse(args: list[str]) -> tuple[tuple[EngineArgs, ServeOptions] | None, object]:
    """Runs the command line with a factory that records what it was given instead of serving, on a
    free port unless the arguments name one."""
    seen: list[tuple[EngineArgs, ServeOptions]] = []

    def factory(engine_args: EngineArgs, options: ServeOptions):
        seen.append((engine_args, options))
        raise ValueError("captured")

    port = [] if "--port" in args else ["--port", str(free_port())]
    result = CliRunner().invoke(make_serve_command(factory), [*port, *args])
    return (seen[0] if seen else None), result


def test_flags_map_onto_serve_options():
    seen, result = parse(
        [
            "--model",
            "m.gguf",
            "--host",
            "localhost",
            "--port",
            str(free_port()),
            "--served-model-name",
            "alias",
            "--api-key",
            "s",
            "--speculative-config",
            SPEC,
            "--no-async-scheduling",
            "--max-num-seqs",
            "3",
            "--max-model-len",
            "64",
            "--max-num-batched-tokens",
            "128",
            "--num-blocks",
            "40",
            "--block-size",
            "8",
            "--seed",
            "5",
            "--dtype",
            "bfloat16",
            "--fast",
            "--max-request-bytes",
            "1000",
            "--fault-after-steps",
            "7",
        ]
    )
    assert result.exit_code == 1 and "captured" in result.output  # the engine's refusal is a clean error
    assert seen is not None
    args, options = seen
    assert (args.model, options.host, options.served_model_name, options.api_key) == ("m.gguf", "localhost", "alias", "s")
    assert args.speculative_config.method == "ngram" and args.speculative_config.num_speculative_tokens == 3
    assert args.async_scheduling is False
    assert (args.max_num_seqs, args.max_model_len, args.max_num_batched_tokens) == (3, 64, 128)
    assert (args.num_blocks, args.block_size, args.seed, args.dtype) == (40, 8, 5, "bfloat16")
    assert (args.numerics, options.max_request_bytes, args.fault_after_steps) == ("fast", 1000, 7)


def test_defaults_are_engine_args_and_serve_options_defaults():
    seen, _ = parse([])
    assert seen is not None
    args, options = seen
    assert args == EngineArgs()
    assert options == ServeOptions(port=options.port)


def test_help_shows_the_defaults_engine_args_uses():
    """`refengine serve --help` states each engine default as EngineArgs holds it (one home)."""
    text = " ".join(CliRunner().invoke(make_serve_command(_no_engine), ["--help"], terminal_width=400).output.split())
    defaults = EngineArgs()
    shown = {
        "--model": defaults.model,
        "--max-num-seqs": defaults.max_num_seqs,
        "--max-num-batched-tokens": defaults.max_num_batched_tokens,
        "--block-size": defaults.block_size,
        "--kv-cache-memory-gib": defaults.kv_cache_memory_gib,
        "--seed": defaults.seed,
        "--dtype": defaults.dtype,
    }
    for flag, value in shown.items():
        assert re.search(rf"{flag} (?:(?! --[a-z-]+ [A-Z\[]).)*?\[default: {re.escape(str(value))}[;\]]", text), flag
    assert "--batch-invariant / --fast Numerics mode. [default: batch-invariant]" in text
    assert defaults.numerics == "batch_invariant"


def test_threads_reach_the_options():
    seen, _ = parse(["--threads", "1"])
    assert seen is not None and seen[1].threads == 1


@pytest.mark.parametrize(
    "args",
    [
        ["--speculative-config", "{"],
        ["--speculative-config", json.dumps({"method": "magic", "num_speculative_tokens": 2})],
        ["--speculative-config", "[]"],
        ["--num-blocks", "4", "--kv-cache-memory-gib", "1"],
        ["--port", "70000"],
        ["--max-num-seqs", "0"],
        ["--dtype", "int3"],
        ["--threads", "0"],
    ],
)
def test_bad_flags_are_usage_errors(args):
    options, result = parse(args)
    assert options is None and result.exit_code == 2, result.output


def test_help_lists_the_vllm_style_flags():
    _, result = parse(["--help"])
    text = result.output
    for flag in [
        "--model",
        "--host",
        "--port",
        "--speculative-config",
        "--async-scheduling / --no-async-scheduling",
        "--max-num-seqs",
        "--max-model-len",
        "--max-num-batched-tokens",
        "--num-blocks",
        "--kv-cache-memory-gib",
        "--block-size",
        "--seed",
        "--api-key",
        "--served-model-name",
        "--dtype",
        "--batch-invariant / --fast",
        "--max-request-bytes",
        "--fault-after-steps",
    ]:
        assert flag in text


def test_a_busy_port_is_refused_before_the_model_loads(tmp_path):
    """The model named does not exist: an error about the port, not the model, shows the port came first."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [*REAL_SERVE, "--model", str(tmp_path / "missing.gguf"), "--port", str(port)],
            capture_output=True, text=True, timeout=120,
        )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"]


def test_tiny_qwen3_answers_a_chat_request_after_one_banner_line():
    server = ServerProcess(REAL_SERVE, "--model", "tiny-qwen3", "--num-blocks", "64")
    try:
        body = {"model": "tiny-qwen3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        returncode, stderr = server.stop()
    assert returncode == 0, stderr
    banners = [line for line in stderr.splitlines() if line.startswith("refengine serve:")]
    assert banners == [
        f"refengine serve: model tiny-qwen3 (float32 weights, dtype float32), numerics batch_invariant, spec off, async on (auto), "
        f"KV 64 blocks of 16, prefix caching on, device cpu, http://127.0.0.1:{server.port}"
    ], stderr
