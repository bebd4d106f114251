"""Token-local math, written so each token's result depends only on that token.

In batch-invariant mode every product runs on zero-padded tiles of exactly TILE_ROWS rows (GPU_TILE_ROWS
for CUDA tensors), because BLAS and cuBLAS pick their kernel by shape; `silu` and `sigmoid` are built from
ops whose scalar and vector code agree bitwise. Why, and what it costs: docs/design/oracle.md
(batch invariance) and reports/batch-invariance.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from refengine.model import skinny_linear, triton_ops
from refengine.model.config import Numerics
from refengine.model.packed_weight import PackedWeight

# NOTE(model): 8 rows cost about as much per tile as 4 when the sizes were first measured (3ef7dbc), and
# halve prefill's calls. reports/batch-invariance.md has the current costs per size: 16 is
# within a few % of 8 at batch 1 and cheaper at batch 16 and in prefill. The size sets the batch-invariant
# logits' last bits, so a change must re-check every figure pinned on them (the llama.cpp comparison, the
# heads' pinned acceptance).
TILE_ROWS = 8
# NOTE(model): on a GPU each tile is one kernel launch, and launches, not FLOPs, bound a small model's
# step: 64 rows keep any decode batch up to 64 in one launch and cut a prefill's launches 8-fold.
GPU_TILE_ROWS = 64


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    numerics: Numerics,
    packed: PackedWeight | None = None,
    *,
    skinny: bool = True,
) -> torch.Tensor:
    """`x[T, K] @ weight[N, K].T`. Fast numerics use the caller's packed copy of `weight` on the CPU
    (`packed`, packed_weight.py) and, for a few float32 rows on a GPU, the skinny kernel
    (`skinny`: Kernels.skinny_gemm, skinny_linear.py)."""
    if numerics is Numerics.BATCH_INVARIANT:
        return _tiled_linear(x, weight)
    if skinny and skinny_linear.applies(x, weight):
        return skinny_linear.skinny_linear(x, weight)
    if packed is not None and packed.applies(x, weight):
        return packed.linear(x, weight)
    return F.linear(x, weight)


def _tiled_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    num_rows = x.shape[0]
    tile_rows = TILE_ROWS if x.device.type == "cpu" else GPU_TILE_ROWS
    padded_rows = -(-num_rows // tile_rows) * tile_rows
    tiles = x.new_zeros(padded_rows, x.shape[1])
    tiles[:num_rows] = x
    out = x.new_empty(padded_rows, weight.shape[0])
    weight_t = weight.t()
    for start in range(0, padded_rows, tile_rows):
        torch.mm(tiles[start : start + tile_rows], weight_t, out=out[start : start + tile_rows])
    return out[:num_rows]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, fused: bool = True) -> torch.Tensor:
    """RMS-normalise the last dim in float32, then scale (Llama's order: cast back before the weight).
    `fused`: the Triton kernel for CUDA tensors (Kernels.fused_ops)."""
    if triton_ops.use_fused(x, fused):  # one launch on a GPU (triton_ops.py)
        return triton_ops.rms_norm(x, weight, eps)
    x32 = x.float()
    # `sqrt` then `reciprocal`, not `rsqrt`: torch's vectorised and scalar `rsqrt` differ in the last
    # bit, so a row's result would depend on where the tensor ends. (`reciprocal` rather than `1.0 / t`:
    # a Python scalar operand costs a wrapping copy per call, and a decode step runs two norms a layer.)
    inv_rms = x32.square().mean(-1, keepdim=True).add(eps).sqrt().reciprocal()
    return weight * (x32 * inv_rms).to(x.dtype)


def silu_and_mul(
    gate_up: torch.Tensor, *, fused: bool = True, numerics: Numerics = Numerics.BATCH_INVARIANT
) -> torch.Tensor:
    """`silu(gate) * up` for `gate_up = [gate | up]` along the last dim."""
    if triton_ops.use_fused(gate_up, fused):
        return triton_ops.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    if numerics is Numerics.FAST:
        return F.silu(gate) * up  # one kernel instead of four; its scalar tail may differ in the last bit
    return gate / (1.0 + torch.exp(-gate)) * up
