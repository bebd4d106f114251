"""The Triton paged-attention kernels in CI: the cases in triton_attention_cases.py under Triton's
interpreter on the CPU. TRITON_INTERPRET must be set before triton is first imported (its own
library functions are decorated then), so the cases run in a fresh interpreter process.
On a GPU machine tests/gpu runs the same cases compiled.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from refengine.model import attention  # noqa: E402
from refengine.model import triton_attention as kernels  # noqa: E402
from refengine.model.config import Kernels, Numerics  # noqa: E402
from refengine.model.kv_cache import LayerKVCache  # noqa: E402


# The kernels alone, and the drafters' fixed-shape proposals on them (with the CUDA graphs' padding), each
# against the reference attention.
@pytest.mark.skipif(torch.cuda.is_available(), reason="tests/gpu runs the cases compiled")
@pytest.mark.parametrize("cases", ["triton_attention_cases.py", "triton_draft_cases.py", "skinny_linear_cases.py"])
def test_kernels_under_the_interpreter(cases):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__).with_name(cases))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_split_plan_is_fixed_in_batch_invariant_mode():
    for tokens in (1, 7, 300):
        assert kernels.split_plan(tokens, 8, 2048, Numerics.BATCH_INVARIANT, 132) == (
            kernels.INVARIANT_SPLIT_KEYS,
            2048 // kernels.INVARIANT_SPLIT_KEYS,
        )
    few = kernels.split_plan(1, 8, 2048, Numerics.FAST, 132)
    many = kernels.split_plan(512, 8, 2048, Numerics.FAST, 132)
    assert few[1] > 1 and few[0] % kernels.BLOCK_N == 0
    assert many == (2048, 1)



def test_dispatch_counts_the_backend():
    from triton_attention_cases import make_case

    q, k, v, cache, meta = make_case([3], [2])
    cpu_cache = LayerKVCache(cache.key.cpu(), cache.value.cpu())
    before = attention.ATTENTION_CALLS["reference"]
    attention.paged_attention(q.cpu(), k.cpu(), v.cpu(), cpu_cache, meta, 0.25, Numerics.FAST)
    assert attention.ATTENTION_CALLS["reference"] == before + 1
    assert attention.attention_implementation(Kernels(), "cpu") == "reference"
    assert attention.attention_implementation(Kernels(attention="triton"), "cpu") == "triton"
    with pytest.raises(ValueError, match="attention backend must be one of auto, triton, reference"):
        Kernels(attention="flash")


def test_the_engine_kernel_choice_reaches_every_product_of_target_and_drafter():
    """`--no-skinny-gemm` is the A/B switch of skinny_linear.py: every module that calls ops.linear (the
    target's projections and lm_head, the drafter's layers, DFlash's context K/V) must see it."""
    from refengine.engine.llm import LLM
    from refengine.model.layers import Linear
    from refengine.model.transformer import Transformer
    from refengine.spec_decode.config import SpeculativeConfig
    from refengine.spec_decode.draft_layer import DraftAttention

    llm = LLM("tiny-qwen3", numerics="fast", skinny_gemm=False, speculative_config=SpeculativeConfig("dflash", 3))
    try:
        core = llm.engine.core
        modules = [*core.runner.model.modules(), *core.runner.drafter.network.modules()]
        choosers = [m for m in modules if isinstance(m, Linear | Transformer | DraftAttention)]
        assert {type(m) for m in choosers} >= {Linear, Transformer, DraftAttention}
        assert all(m.kernels.skinny_gemm is False for m in choosers)
    finally:
        llm.engine.core.shutdown()
