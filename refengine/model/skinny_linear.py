"""The matrix product of a few float32 rows on a GPU, in Triton kernels that read the weight once.

A verify step at small batch multiplies k + 1 rows by every weight, which cuBLAS runs in SIMT GEMMs tiled
for many rows. Two kernels, a program per block of output columns each: one row (a matrix-vector
product), and 2..MAX_ROWS rows against the same weight block; outputs of WIDE_N columns or more stay with
cuBLAS. Block sizes come from H200 timings. Design and figures: docs/design/architecture.md (kernels).
"""

from __future__ import annotations

import torch

from refengine.model.device import on_device

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None
    tl = None

MAX_ROWS = 8
# Rows of 2..MAX_ROWS against a weight this wide or wider stay with cuBLAS.
WIDE_N = 2048
# (BLOCK_N, BLOCK_K, num_warps) of the one-row and of the few-rows kernel.
ONE_ROW_CONFIG = (8, 256, 4)
FEW_ROWS_CONFIG = (4, 256, 4)


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Float32 rows on a GPU under inference mode (the kernels have no backward) in a shape the kernels
    take, against a weight with unit stride in K."""
    return (
        triton is not None
        and x.is_cuda
        and torch.is_inference_mode_enabled()
        and x.dim() == 2
        and takes_shape(x.shape[0], weight.shape[0])
        and x.dtype == weight.dtype == torch.float32
        and weight.stride(1) == 1
    )


def takes_shape(num_rows: int, n: int) -> bool:
    """One row against any weight, or 2..MAX_ROWS rows against fewer than WIDE_N outputs."""
    return num_rows == 1 or (1 < num_rows <= MAX_ROWS and n < WIDE_N)


if triton is not None:

    @triton.jit
    def _one_row_kernel(x_ptr, w_ptr, out_ptr, n, k, stride_w, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """out[j] = sum_k x[k] * w[j, k] for the program's BLOCK_N output columns j."""
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for start in range(0, k, BLOCK_K):
            offs_k = start + tl.arange(0, BLOCK_K)
            in_k = offs_k < k
            x = tl.load(x_ptr + offs_k, mask=in_k, other=0.0)
            w = tl.load(w_ptr + offs_n[:, None] * stride_w + offs_k[None, :], mask=(offs_n[:, None] < n) & in_k[None, :], other=0.0)
            acc += w * x[None, :]  # float32 FMA: no TF32, whatever torch's matmul precision setting
        tl.store(out_ptr + offs_n, tl.sum(acc, axis=1), mask=offs_n < n)

    @triton.jit(do_not_specialize=["num_rows"])
    def _few_rows_kernel(
        x_ptr, w_ptr, out_ptr, num_rows, n, k, stride_x, stride_w, stride_out,
        ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        """out[r, j] = sum_k x[r, k] * w[j, k] for every row r and the program's BLOCK_N columns j."""
        offs_r = tl.arange(0, ROWS)
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((ROWS, BLOCK_N, BLOCK_K), dtype=tl.float32)
        for start in range(0, k, BLOCK_K):
            offs_k = start + tl.arange(0, BLOCK_K)
            in_k = offs_k < k
            x = tl.load(
                x_ptr + offs_r[:, None] * stride_x + offs_k[None, :],
                mask=(offs_r[:, None] < num_rows) & in_k[None, :],
                other=0.0,
            )
            w = tl.load(
                w_ptr + offs_n[:, None] * stride_w + offs_k[None, :],
                mask=(offs_n[:, None] < n) & in_k[None, :],
                other=0.0,
            )
            acc += x[:, None, :] * w[None, :, :]
        tl.store(
            out_ptr + offs_r[:, None] * stride_out + offs_n[None, :],
            tl.sum(acc, axis=2),
            mask=(offs_r[:, None] < num_rows) & (offs_n[None, :] < n),
        )


def skinny_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`x[M, K] @ weight[N, K].T` for a product that `applies` accepts."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    num_rows, k = x.shape
    n = weight.shape[0]
    out = torch.empty(num_rows, n, dtype=x.dtype, device=x.device)
    with on_device(x.device):
        if num_rows == 1:
            block_n, block_k, num_warps = ONE_ROW_CONFIG
            _one_row_kernel[(triton.cdiv(n, block_n),)](
                x, weight, out, n, k, weight.stride(0), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps
            )
        else:
            block_n, block_k, num_warps = FEW_ROWS_CONFIG
            _few_rows_kernel[(triton.cdiv(n, block_n),)](
                x, weight, out, num_rows, n, k, x.stride(0), weight.stride(0), out.stride(0),
                ROWS=MAX_ROWS, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
            )  # fmt: skip
    return out
