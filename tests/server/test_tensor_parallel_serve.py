"""`refengine serve` and `refengine generate` with --tensor-parallel-size 2 on tiny-qwen3 (gloo, one spawned
worker rank): the server answers over HTTP as `generate` does; killing one rank kills the engine with
`engine is dead: rank K exited` and leaves no process behind; a refused size is one line."""

import signal
import time

import httpx
import psutil
import pytest
from click.testing import CliRunner
from server_helpers import TINY_MODEL
from server_process import REAL_SERVE, ServerProcess

from refengine.distributed.parallel_state import NCCL_SAFE_ENV
from refengine.entrypoints.cli_generate import generate_command

TP2 = ("--tensor-parallel-size", "2")
PROMPT = "The tensor"


def worker_ranks(server: ServerProcess) -> list[psutil.Process]:
    """The server's spawned rank processes (not multiprocessing's resource tracker)."""
    children = psutil.Process(server.proc.pid).children(recursive=True)
    return [c for c in children if "spawn_main" in " ".join(c.cmdline())]


def still_running(processes: list[psutil.Process], within_s: float = 60) -> list[int]:
    """The pids among `processes` that still run after up to `within_s` (an exited, unreaped one does not)."""
    deadline = time.monotonic() + within_s
    while True:
        running = []
        for p in processes:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    running.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.1)


def completion(server: ServerProcess) -> httpx.Response:
    body = {"model": TINY_MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)


def test_tp2_serves_over_http_what_generate_prints_and_its_ranks_outlive_no_sigkill():
    printed = CliRunner().invoke(generate_command, ["--model", TINY_MODEL, *TP2, "--prompt", PROMPT, "--max-tokens", "8"])
    assert printed.exit_code == 0, printed.output
    server = ServerProcess(REAL_SERVE, "--model", TINY_MODEL, *TP2)
    try:
        ranks = worker_ranks(server)
        assert len(ranks) == 1
        # NVLink multicast stays off in every rank's own environment, not only in the engine's.
        assert {k: ranks[0].environ().get(k) for k in NCCL_SAFE_ENV} == NCCL_SAFE_ENV
        answer = completion(server)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 8
        # generate holds back a trailing partial UTF-8 character that the server sends as U+FFFD
        assert answer.json()["choices"][0]["text"].startswith(printed.output.removesuffix("\n"))
    finally:
        # SIGKILL gives rank 0 no chance to shut its workers down: they go by themselves.
        server.stop(signal.SIGKILL)
    assert not still_running(ranks), "a rank outlived its engine's process"


def test_killing_a_rank_kills_the_engine_and_leaves_no_process():
    server = ServerProcess(REAL_SERVE, "--model", TINY_MODEL, *TP2)
    (rank1,) = worker_ranks(server)
    left = psutil.Process(server.proc.pid).children(recursive=True)
    try:
        assert completion(server).status_code == 200
        rank1.kill()
        answer = completion(server)
        assert answer.status_code == 500
        assert answer.json()["error"]["message"] == "engine is dead: rank 1 exited"
        health = httpx.get(f"{server.url}/health", timeout=30)
        assert health.status_code == 503 and health.json()["error"]["message"] == "engine is dead: rank 1 exited"
        assert server.proc.poll() is None, "the process stays up to say why"
    finally:
        code, stderr = server.stop(signal.SIGINT)
    assert code == 0, stderr
    assert not still_running(left), "a process was left behind"


@pytest.mark.parametrize("size, message", [("3", "does not divide the model's 4 attention heads")])
def test_a_size_the_model_cannot_split_is_one_line(size, message):
    out = CliRunner().invoke(generate_command, ["--model", TINY_MODEL, "--tensor-parallel-size", size, "--prompt", PROMPT])
    assert out.exit_code == 1 and message in out.output and out.output.count("\n") == 1
