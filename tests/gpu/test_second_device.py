"""An engine on cuda:1 (not the thread's current device): the Triton kernels, the CUDA graphs, the
in-flight copies' events and the drafter all run on the model's device, and the tokens are those of
the same engine on cuda:0. Before the device guards, every Triton launch went to device 0 ("Pointer
argument (at 0) cannot be accessed from Triton").

Run on a machine with two GPUs with `pytest -m gpu tests/gpu`; skipped elsewhere.
"""

import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]

pytest.importorskip("triton")

from refengine.engine.llm import LLM  # noqa: E402
from refengine.model.config import Numerics  # noqa: E402
from refengine.model.shapes import build_random_model  # noqa: E402
from refengine.sampling_params import SamplingParams  # noqa: E402
from refengine.spec_decode.config import SpeculativeConfig  # noqa: E402

PROMPTS = [[5, 9, 13, 200, 7] * 3, [100, 3, 3, 4], list(range(20, 60))]


def run_on(device: str, **kwargs):
    # Built on cuda:0 each time (same seed, same weights), then moved by the engine to `device`.
    loaded = build_random_model(
        "qwen3-0.6b", seed=1, dtype=torch.float32, numerics=Numerics.BATCH_INVARIANT, device="cuda:0",
        num_hidden_layers=2, vocab_size=1024, hidden_size=256, intermediate_size=512,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64,
    )  # fmt: skip
    llm = LLM(loaded, dtype="float32", device=device, max_num_seqs=4, max_model_len=256, block_size=16,
              num_blocks=64, **kwargs)  # fmt: skip
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    runner = llm.engine.core.runner
    llm.engine.core.shutdown()
    return [o.token_ids for o in outs], runner


@pytest.mark.parametrize(
    "kwargs",
    [{"cuda_graphs": False}, {"cuda_graphs": True}, {"cuda_graphs": True, "speculative_config": SpeculativeConfig("eagle", 3)}],
    ids=["eager", "graphs", "eagle-graphs"],
)
def test_engine_on_cuda1_matches_cuda0(kwargs):
    assert torch.cuda.current_device() == 0  # the engine below must not rely on being current
    first, _ = run_on("cuda:0", **kwargs)
    second, runner = run_on("cuda:1", **kwargs)
    assert runner.device == torch.device("cuda:1")
    if kwargs["cuda_graphs"]:
        assert runner.num_graph_steps > 0  # the graphs were captured and replayed on cuda:1
    assert torch.cuda.current_device() == 0  # the guards restored the current device
    assert second == first


def test_oracle_on_cuda1():
    proc = subprocess.run(
        [sys.executable, "-m", "refengine.cli", "oracle", "--model", "tiny-llama", "--methods", "none,eagle",
         "--c", "2", "--prompts", "2", "--max-tokens", "8", "--device", "cuda:1"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 failed arm(s)" in proc.stdout
