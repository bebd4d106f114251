"""Cases for the skinny Triton product (model/skinny_linear.py), checked against a float64 product.

Run by test_triton_attention.py under Triton's interpreter on the CPU (TRITON_INTERPRET=1 must be set
before triton is imported, so that runs in a subprocess), and compiled by tests/gpu on a GPU, where
ops.linear's dispatch to the kernel is checked too.
"""

import pytest
import torch

pytest.importorskip("triton")

from refengine.model import ops, skinny_linear  # noqa: E402
from refengine.model.config import Numerics  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def operands(rows: int, k: int, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=generator)
    w = torch.randn(n, k, generator=generator) / k**0.5
    return x.to(DEVICE), w.to(DEVICE)


def exact(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.double() @ w.double().T).float()


# K both a multiple of the kernel's K block and not; N not a multiple of its N block; SmolLM2's down_proj.
@pytest.mark.parametrize("k,n", [(256, 40), (200, 37), (1536, 576), (64, 2100)])
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
def test_the_product_is_the_float64_one_rounded(rows, k, n):
    x, w = operands(rows, k, n)
    got = skinny_linear.skinny_linear(x, w)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    torch.testing.assert_close(got, exact(x, w), rtol=1e-5, atol=1e-5)


def test_a_row_gives_the_same_bits_beside_one_to_seven_others():
    """The few-rows kernel pads to MAX_ROWS inside, so a verify row's result does not depend on how many
    rows share the launch."""
    x, w = operands(8, 320, 24, seed=1)
    together = skinny_linear.skinny_linear(x, w)
    for rows in range(2, 8):
        assert torch.equal(skinny_linear.skinny_linear(x[:rows], w), together[:rows])


def test_rows_with_a_stride_and_a_weight_slice():
    """A row view of a wider tensor, and rows of a weight (a KV-only slice of qkv_proj, as DFlash's
    store_context takes it)."""
    wide, w = operands(3, 2 * 96, 64, seed=2)
    x = wide[:, :96]
    rows_of_w = w[16:, :96]
    torch.testing.assert_close(skinny_linear.skinny_linear(x, rows_of_w), exact(x, rows_of_w), rtol=1e-5, atol=1e-5)


def test_the_kernel_takes_only_what_it_is_for():
    x, w = operands(8, 64, 16)
    with torch.inference_mode():
        assert skinny_linear.applies(x, w) is (DEVICE == "cuda")
        nine, _ = operands(9, 64, 16)
        assert not skinny_linear.applies(nine, w)
        one, wide = operands(1, 64, skinny_linear.WIDE_N)
        assert skinny_linear.applies(one, wide) is (DEVICE == "cuda")  # a decode row against an lm_head
        assert not skinny_linear.applies(x, wide)  # verify rows against it: cuBLAS's tiles
        assert not skinny_linear.applies(x.bfloat16(), w.bfloat16())
        assert not skinny_linear.applies(x.cpu(), w.cpu())
        assert not skinny_linear.applies(x, w.T.contiguous().T)  # K not contiguous in the weight
    assert not skinny_linear.applies(x, w)  # outside inference mode: the kernel has no backward


def test_the_shapes_the_kernels_take():
    """One row against any width (a decode step's lm_head too); 2..8 rows only against fewer than WIDE_N
    outputs, where the skinny kernel beat cuBLAS on an H200; never none or more than 8 rows."""
    wide = skinny_linear.WIDE_N
    assert skinny_linear.takes_shape(1, 49152) and skinny_linear.takes_shape(1, 16)
    assert skinny_linear.takes_shape(2, wide - 1) and skinny_linear.takes_shape(8, wide - 1)
    assert not skinny_linear.takes_shape(2, wide) and not skinny_linear.takes_shape(8, 49152)
    assert not skinny_linear.takes_shape(9, 16) and not skinny_linear.takes_shape(0, 16)


@pytest.mark.skipif(DEVICE != "cuda", reason="ops.linear sends only CUDA tensors to the kernel")
def test_fast_linear_runs_the_kernel_and_batch_invariant_never_does():
    x, w = operands(5, 576, 960)
    with torch.inference_mode():
        fast = ops.linear(x, w, Numerics.FAST)
        assert torch.equal(fast, skinny_linear.skinny_linear(x, w))
        assert not torch.equal(ops.linear(x, w, Numerics.FAST, skinny=False), fast)  # cuBLAS's sum order
        invariant = ops.linear(x, w, Numerics.BATCH_INVARIANT)
    torch.testing.assert_close(invariant, exact(x, w), rtol=1e-5, atol=1e-5)
