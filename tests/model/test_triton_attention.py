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
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from refengine.model import attention  # noqa: E402
from refengine.model import triton_attention as kernels  # noqa: E402
from refengine.model.config import Kernels, Numerics  # noqa: E402
from refengine.model.kv_cache import LayerKVCache  # noqa: E402


# The kernels alone, and the drafters' fixed-shape proposals on them (with the CUDA graphs' padding), each
# against the reference attention; and the engine on them, spec on against spec off.
@pytest.mark.skipif(torch.cuda.is_available(), reason="tests/gpu runs the cases compiled")
@pytest.mark.parametrize(
    "cases", ["triton_attention_cases.py", "triton_draft_cases.py", "skinny_linear_cases.py", "triton_engine_cases.py"]
)
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


# ---- invariant 52 (docs/invariants.md): a program per window of a sequence's rows --------------------------


def test_kv_bytes_read_counts_each_windows_keys_once():
    """The accounting of the split kernel's K/V reads (gpu_bench reports it): a program per token reads every
    row's keys; a program per window reads its longest row's keys, once for all its rows."""
    per_key = 2 * 8 * 128 * 2  # K and V, 8 KV heads of 128 bfloat16
    decode = kernels.kv_bytes_read([1, 1], [1152, 7], 8, 128, 2, rows=8)
    assert decode == kernels.kv_bytes_read([1, 1], [1152, 7], 8, 128, 2, rows=1) == (1152 + 7) * per_key
    # 5 rows at positions 1147..1151: one window; at 1150..1154: windows 143 and 144.
    assert kernels.kv_bytes_read([5], [1152], 8, 128, 2, rows=1) == sum(range(1148, 1153)) * per_key
    assert kernels.kv_bytes_read([5], [1152], 8, 128, 2, rows=8) == 1152 * per_key
    assert kernels.kv_bytes_read([5], [1155], 8, 128, 2, rows=8) == (1152 + 1155) * per_key
    # The figure: qwen3-8b (36 layers), c = 32, k + 1 = 5 rows ending at 1,152 keys.
    before = 36 * kernels.kv_bytes_read([5] * 32, [1152] * 32, 8, 128, 2, rows=1)
    after = 36 * kernels.kv_bytes_read([5] * 32, [1152] * 32, 8, 128, 2, rows=kernels.rows_per_program(4))
    assert (round(before / 1e9, 1), round(after / 1e9, 1)) == (27.1, 5.4)


@settings(derandomize=True, database=None, deadline=None, max_examples=200)
@given(
    steps=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), min_size=1, max_size=12),
    group=st.sampled_from([1, 2, 3, 4, 8, 16, 32]),
)
def test_the_grid_covers_every_window_of_every_step(steps, group):
    """The split kernel's first grid dimension, from shapes alone, is never short of the windows the rows
    touch (a missing program leaves rows unwritten), and the tile holds the window's rows and heads."""
    rows = kernels.rows_per_program(group)
    assert rows >= 1 and rows * group <= kernels.block_m(group) <= max(kernels.MAX_BLOCK_M, group)
    windows = {(s, pos // rows) for s, (computed, new) in enumerate(steps) for pos in range(computed, computed + new)}
    num_tokens = sum(new for _, new in steps)
    assert len(windows) <= kernels.num_row_blocks(num_tokens, len(steps), rows) <= max(num_tokens, 1)
