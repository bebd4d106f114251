"""Fused Triton versions of the token-local ops, for CUDA tensors: RMSNorm, the Qwen3 q/k head norms
with the rotary embedding, and SiLU-and-multiply, one launch each where the unfused ops launch about 60
small kernels a layer. Each works row by row, so it is batch-invariant by construction; it rounds once at
the end, so its last bits may differ from ops.py, which stays the reference. Design:
docs/design/architecture.md (numerics and kernels).
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

def use_fused(x: torch.Tensor, enabled: bool) -> bool:
    """Whether the fused kernels run for `x`: asked for (Kernels.fused_ops), available, and on a GPU."""
    return enabled and triton is not None and x.is_cuda


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


if triton is not None:

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_out, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        mean_square = tl.sum(x * x, axis=0) / n
        normed = (x * (1.0 / tl.sqrt(mean_square + eps))).to(x_ptr.dtype.element_ty)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        tl.store(out_ptr + row * stride_out + offs, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _add_rms_norm_kernel(
        x_ptr, delta_ptr, w_ptr, sum_ptr, out_ptr, stride_x, stride_d, stride_s, stride_out, n, eps,
        BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
        d = tl.load(delta_ptr + row * stride_d + offs, mask=mask, other=0.0)
        total = (x.to(tl.float32) + d.to(tl.float32)).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * stride_s + offs, total, mask=mask)
        t32 = total.to(tl.float32)
        mean_square = tl.sum(t32 * t32, axis=0) / n
        normed = (t32 * (1.0 / tl.sqrt(mean_square + eps))).to(sum_ptr.dtype.element_ty)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        tl.store(out_ptr + row * stride_out + offs, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, stride_x, stride_out, n, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * stride_x + n + offs, mask=mask, other=0.0).to(tl.float32)
        out = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + row * stride_out + offs, out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _norm_rope_kernel(
        q_ptr, k_ptr, qw_ptr, kw_ptr, q_out_ptr, k_out_ptr, pos_ptr, cos_ptr, sin_ptr,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh,
        stride_cos, eps,
        NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NORM: tl.constexpr,
    ):  # fmt: skip
        """One program per (token, head) over the q heads then the k heads."""
        token = tl.program_id(0)
        head = tl.program_id(1)
        half: tl.constexpr = HEAD_DIM // 2
        offs = tl.arange(0, half)
        if head < NUM_Q_HEADS:
            base = q_ptr + token * stride_qt + head * stride_qh
            w_ptr = qw_ptr
            obase = q_out_ptr + token * stride_qot + head * stride_qoh
        else:
            base = k_ptr + token * stride_kt + (head - NUM_Q_HEADS) * stride_kh
            w_ptr = kw_ptr
            obase = k_out_ptr + token * stride_kot + (head - NUM_Q_HEADS) * stride_koh
        lo = tl.load(base + offs)
        hi = tl.load(base + half + offs)
        if NORM:
            lo32 = lo.to(tl.float32)
            hi32 = hi.to(tl.float32)
            mean_square = (tl.sum(lo32 * lo32, axis=0) + tl.sum(hi32 * hi32, axis=0)) / HEAD_DIM
            inv = 1.0 / tl.sqrt(mean_square + eps)
            lo = (tl.load(w_ptr + offs) * (lo32 * inv).to(lo.dtype)).to(lo.dtype)
            hi = (tl.load(w_ptr + half + offs) * (hi32 * inv).to(hi.dtype)).to(hi.dtype)
        position = tl.load(pos_ptr + token)
        cos_lo = tl.load(cos_ptr + position * stride_cos + offs)
        cos_hi = tl.load(cos_ptr + position * stride_cos + half + offs)
        sin_lo = tl.load(sin_ptr + position * stride_cos + offs)
        sin_hi = tl.load(sin_ptr + position * stride_cos + half + offs)
        lo32 = lo.to(tl.float32)
        hi32 = hi.to(tl.float32)
        # rotate_half: [-hi, lo]
        out_lo = lo32 * cos_lo - hi32 * sin_lo
        out_hi = hi32 * cos_hi + lo32 * sin_hi
        tl.store(obase + offs, out_lo.to(q_out_ptr.dtype.element_ty))
        tl.store(obase + half + offs, out_hi.to(q_out_ptr.dtype.element_ty))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, as ops.rms_norm (float32 statistics, cast, then the weight)."""
    shape = x.shape
    n = shape[-1]
    rows = x.reshape(-1, n)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if rows.shape[0]:
        with on_device(x.device):
            _rms_norm_kernel[(rows.shape[0],)](
                rows, weight, out, rows.stride(0), out.stride(0), n, eps, BLOCK=_next_pow2(n),
                num_warps=4 if n <= 2048 else 8,
            )
    return out.reshape(shape)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta)) for `[T, H]` rows in one launch: a residual add and the next
    norm (the sum is rounded to x's dtype before the norm reads it, as the unfused ops do)."""
    n = x.shape[-1]
    x = x if x.stride(-1) == 1 else x.contiguous()
    delta = delta if delta.stride(-1) == 1 else delta.contiguous()
    total = torch.empty_like(x)
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if x.shape[0]:
        with on_device(x.device):
            _add_rms_norm_kernel[(x.shape[0],)](
                x, delta, weight, total, out, x.stride(0), delta.stride(0), total.stride(0), out.stride(0), n, eps,
                BLOCK=_next_pow2(n), num_warps=4 if n <= 2048 else 8,
            )  # fmt: skip
    return total, out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    rows = gate_up.reshape(-1, gate_up.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    n = rows.shape[-1] // 2
    out = torch.empty(rows.shape[0], n, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    if rows.shape[0]:
        with on_device(gate_up.device):
            _silu_mul_kernel[(rows.shape[0], triton.cdiv(n, block))](
                rows, out, rows.stride(0), out.stride(0), n, BLOCK=block
            )
    return out.reshape(*gate_up.shape[:-1], n)


def norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`q[T, Hq, D]`, `k[T, Hkv, D]` -> optional per-head RMSNorm (Qwen3's q_norm / k_norm), then the
    rotary embedding at each token's position (half-split layout); new contiguous tensors, one launch."""
    num_tokens, num_q, head_dim = q.shape
    num_k = k.shape[1]
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    q_out = torch.empty(num_tokens, num_q, head_dim, dtype=q.dtype, device=q.device)
    k_out = torch.empty(num_tokens, num_k, head_dim, dtype=k.dtype, device=k.device)
    norm = q_weight is not None and k_weight is not None
    if num_tokens:
        with on_device(q.device):
            _norm_rope_kernel[(num_tokens, num_q + num_k)](
                q, k, q_weight if norm else q, k_weight if norm else k, q_out, k_out, positions, cos, sin,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), q_out.stride(0), q_out.stride(1),
                k_out.stride(0), k_out.stride(1), cos.stride(0), eps,
                NUM_Q_HEADS=num_q, HEAD_DIM=head_dim, NORM=norm,
            )  # fmt: skip
    return q_out, k_out
