"""ladder identity against real `refengine serve` processes on a tiny random-weight model.

Async scheduling on and off with the same drafter (a seeded random-init eagle head) must give identical
tokens at temperature 0, and at temperature 0.8 with request seeds. Two servers with different --seed and
no request seed must diverge, and the reported position must be where the token ids first differ.
"""

import asyncio
import json
import sys
from pathlib import Path

import pytest

from ladder import engine_info
from ladder.endpoint import Endpoint
from ladder.server import ServerProcess, free_port
from refengine.model.tiny import build_tiny_model, save_hf_folder

SPEC = '{"method": "eagle", "num_speculative_tokens": 3}'
POOL = ("--num-blocks", "256", "--block-size", "4", "--max-model-len", "128", "--max-num-seqs", "4",
        "--log-level", "warning")
FLAGS = ("--c", "1,4", "--prompts", "4", "--max-tokens", "12", "--prompt-words", "8")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Three servers on one tiny model: async on, async off (same drafter, seed 0), and seed 1."""
    root = tmp_path_factory.mktemp("identity")
    # qwen3: its untied output head gives flat logits, so sampling at 0.8 is far from greedy (llama's tied
    # random embeddings make one token win by a wide margin, and every seed samples it)
    folder = save_hf_folder(build_tiny_model("qwen3", seed=5), root / "model")
    refengine = Path(sys.executable).with_name("refengine")
    variants = {"async": ("--async-scheduling", "--seed", "0"), "sync": ("--no-async-scheduling", "--seed", "0"),
                "seed1": ("--async-scheduling", "--seed", "1")}
    procs, urls = [], {}
    try:
        for name, flags in variants.items():
            port = free_port()
            cmd = " ".join([str(refengine), "serve", "--model", str(folder), "--port", str(port),
                            "--speculative-config", f"'{SPEC}'", *POOL, *flags])
            procs.append(ServerProcess(cmd, root / f"{name}.log"))
            urls[name] = f"http://127.0.0.1:{port}"

        async def ready() -> list[dict]:
            reports = []
            for proc, url in zip(procs, urls.values()):
                async with Endpoint(url, None, True) as ep:
                    await proc.wait_ready(ep, 300)
                    reports.append(engine_info.from_server({}, await ep.optional_text("/metrics"), {}))
            return reports
        reports = asyncio.run(ready())
        # what each server resolved: the same drafter, scheduling as asked
        assert [(r["spec_method"], r["async_scheduling"]) for r in reports] == [
            ("eagle (random-init head)", "True"), ("eagle (random-init head)", "False"),
            ("eagle (random-init head)", "True")]
        yield urls
    finally:
        for proc in procs:
            proc.stop(grace_s=10)


@pytest.fixture
def identity(capsys, tmp_path):
    from ladder.cli import main

    def run(*args: str):
        out = tmp_path / f"v{len(list(tmp_path.iterdir()))}.json"
        with pytest.raises(SystemExit) as exc:
            main(["identity", *args, "--out", str(out)])
        return exc.value.code, capsys.readouterr().out, json.loads(out.read_text())["verdicts"]
    return run


def test_async_on_and_off_identical_greedy_and_seeded(servers, identity):
    for extra in ((), ("--temperature", "0.8", "--seed", "11")):
        code, out, verdicts = identity("--a", servers["async"], "--b", servers["sync"], *FLAGS, *extra)
        assert code == 0, out
        assert "compares token_ids" in out and out.strip().endswith("identical 8/8")
        assert all(len(v["a"]["token_ids"]) == 12 for v in verdicts)


def test_different_server_seeds_diverge_at_the_first_differing_token(servers, identity):
    code, out, verdicts = identity("--a", servers["async"], "--b", servers["seed1"], "--c", "1", "--prompts", "4",
                                   "--max-tokens", "12", "--prompt-words", "8", "--temperature", "0.8")
    assert code == 1 and "DIVERGED at token" in out
    for v in verdicts:
        ids_a, ids_b = v["a"]["token_ids"], v["b"]["token_ids"]
        if v["identical"]:
            assert ids_a == ids_b
            continue
        p = v["position"]
        assert ids_a[:p] == ids_b[:p] and ids_a[p] != ids_b[p]
        assert f"c=1 #{v['index']}  DIVERGED at token {p} (of 12 / 12 tokens)" in out
