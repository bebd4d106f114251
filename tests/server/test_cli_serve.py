"""`refengine serve` end to end: a real server subprocess on tiny-qwen3 with fault injection passed
through by flag or environment, the process surviving its engine; and the flag parsing. (Concurrent
streams through a serve subprocess: test_real_engine.py.)"""

import json
import signal

import httpx
import pytest
from click.testing import CliRunner
from server_helpers import TINY_MODEL
from server_process import REAL_SERVE, ServerProcess

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


def parse(args: list[str]) -> tuple[ServeOptions | None, object]:
    """Runs the command line with a factory that records the options instead of serving."""
    seen: list[ServeOptions] = []

    def factory(options: ServeOptions):
        seen.append(options)
        raise ValueError("captured")

    result = CliRunner().invoke(make_serve_command(factory), args)
    return (seen[0] if seen else None), result


def test_flags_map_onto_serve_options():
    options, result = parse(
        [
            "--model",
            "m.gguf",
            "--host",
            "0.0.0.0",
            "--port",
            "9",
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
    assert options is not None
    assert (options.model, options.host, options.port, options.served_model_name, options.api_key) == (
        "m.gguf",
        "0.0.0.0",
        9,
        "alias",
        "s",
    )
    assert (
        options.speculative_config.method == "ngram"
        and options.speculative_config.num_speculative_tokens == 3
    )
    assert options.async_scheduling is False
    assert (options.max_num_seqs, options.max_model_len, options.max_num_batched_tokens) == (3, 64, 128)
    assert (options.num_blocks, options.block_size, options.seed, options.dtype) == (40, 8, 5, "bfloat16")
    assert (options.numerics, options.max_request_bytes, options.fault_after_steps) == ("fast", 1000, 7)


def test_defaults():
    options, _ = parse([])
    assert options is not None
    assert (options.model, options.host, options.port, options.numerics) == (
        "smollm2",
        "127.0.0.1",
        8000,
        "batch_invariant",
    )
    assert options.async_scheduling is None and options.speculative_config is None
    assert options.fault_after_steps is None and options.api_key is None
    assert options.threads is None  # torch's own default


def test_threads_reach_the_options():
    options, _ = parse(["--threads", "1"])
    assert options is not None and options.threads == 1


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
