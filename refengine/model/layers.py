"""The parameterised building blocks of a decoder layer."""

from __future__ import annotations

import math

import torch
from torch import nn

from refengine.model import ops
from refengine.model.config import DEFAULT_KERNELS, Kernels, Llama3RopeScaling, ModelConfig, Numerics
from refengine.model.packed_weight import PackedWeight


class Linear(nn.Module):
    """A bias-free projection; `weight` is `[out_features, in_features]` as in the checkpoints."""

    kernels: Kernels = DEFAULT_KERNELS  # set_kernels chooses per model

    def __init__(self, in_features: int, out_features: int, numerics: Numerics, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        self.numerics = numerics
        self.packed = PackedWeight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.numerics, self.packed, skinny=self.kernels.skinny_gemm)


class RMSNorm(nn.Module):
    kernels: Kernels = DEFAULT_KERNELS  # set_kernels chooses per model

    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps, fused=self.kernels.fused_ops)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding in the half-split layout (HF's `rotate_half`).

    cos/sin are tabulated once for every position, so applying them is a gather and elementwise
    math: no token's result depends on another's.
    """

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: Llama3RopeScaling | None,
    ) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        if scaling is not None:
            inv_freq = _llama3_scaled(inv_freq, scaling)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        # [cos | sin with its first half negated], one row per position: one gather serves a whole
        # step, and rotate_half's negation moves into the table (`-a * b == a * -b` exactly, so the
        # result is bitwise the textbook `x * cos + rotate_half(x) * sin`).
        half = head_dim // 2
        sin_signed = torch.cat([-self.sin[:, :half], self.sin[:, half:]], dim=-1)
        self.register_buffer("cos_sin_signed", torch.cat([self.cos, sin_signed], dim=-1), persistent=False)

    @classmethod
    def from_config(cls, config: ModelConfig) -> RotaryEmbedding:
        """The target's rotary embedding; drafter heads use the same one."""
        return cls(config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling)

    def rotate(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`x[T, H, D]` rotated by its token's position; any heads (queries and keys side by side too)."""
        tables = self.cos_sin_signed[positions.to(self.cos.device)].unsqueeze(1)
        cos, sin_signed = tables.chunk(2, dim=-1)
        x32 = x.float()
        # roll by half swaps the halves: [x2 | x1], rotate_half(x) before its sign
        return (x32 * cos + x32.roll(x.shape[-1] // 2, -1) * sin_signed).to(x.dtype)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`q[T, Hq, D]`, `k[T, Hkv, D]` rotated by their token's position."""
        rotated = self.rotate(positions, torch.cat([q, k], dim=1))
        return rotated[:, : q.shape[1]], rotated[:, q.shape[1] :]


def _llama3_scaled(inv_freq: torch.Tensor, scaling: Llama3RopeScaling) -> torch.Tensor:
    """Llama 3.1: long wavelengths are stretched by `factor`, short ones kept, the band between blended."""
    original = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = original / scaling.low_freq_factor
    high_freq_wavelen = original / scaling.high_freq_factor
    blend = (original / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - blend) * inv_freq / scaling.factor + blend * inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, blended, scaled)


def set_kernels(module: nn.Module, kernels: Kernels) -> None:
    """Choose the kernels of every submodule that chooses (those with a `kernels` attribute)."""
    for sub in module.modules():
        if hasattr(sub, "kernels"):
            sub.kernels = kernels
