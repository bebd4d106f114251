"""One pre-norm decoder layer: attention then a SwiGLU MLP, each around a residual."""

from __future__ import annotations

import torch
from torch import nn

from refengine.model import triton_ops
from refengine.model.attention import paged_attention
from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.config import DEFAULT_KERNELS, Kernels, ModelConfig, Numerics
from refengine.model.kv_cache import LayerKVCache
from refengine.model.layers import Linear, RMSNorm, RotaryEmbedding
from refengine.model.ops import silu_and_mul


def fuses_norm_rope(q: torch.Tensor, kernels: Kernels) -> bool:
    """Whether `fused_norm_rope` runs for these queries: fused ops asked for, on a GPU, a head size the
    kernel takes."""
    return triton_ops.use_fused(q, kernels.fused_ops) and q.shape[-1] in (32, 64, 128, 256)


def fused_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_norm: RMSNorm | None,
    k_norm: RMSNorm | None,
    rotary: RotaryEmbedding,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The q/k head norms (where the layer has them) and the rotary embedding in one launch
    (triton_ops.py)."""
    q_weight = None if q_norm is None else q_norm.weight
    k_weight = None if k_norm is None else k_norm.weight
    eps = 0.0 if q_norm is None else q_norm.eps
    return triton_ops.norm_rope(q, k, q_weight, k_weight, eps, positions.to(q.device), rotary.cos, rotary.sin)


class Attention(nn.Module):
    kernels: Kernels = DEFAULT_KERNELS  # set_kernels chooses per model

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, numerics: Numerics, dtype: torch.dtype):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.numerics = numerics
        self.qkv_proj = Linear(config.hidden_size, config.q_size + 2 * config.kv_size, numerics, dtype)
        self.o_proj = Linear(config.q_size, config.hidden_size, numerics, dtype)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if config.qk_norm else None
        self.rotary = rotary

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata, cache: LayerKVCache
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if fuses_norm_rope(q, self.kernels):
            q, k = fused_norm_rope(q, k, self.q_norm, self.k_norm, self.rotary, positions)
        elif self.q_norm is not None and self.k_norm is not None:
            q, k = self.rotary(positions, self.q_norm(q), self.k_norm(k))
        else:
            # Queries and keys sit side by side in qkv: one rotation over both heads' columns.
            qk = qkv[:, : q_size + kv_size].view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim)
            q, k = self.rotary.rotate(positions, qk).split([self.num_heads, self.num_kv_heads], dim=1)
        out = paged_attention(q, k, v, cache, meta, self.head_dim**-0.5, self.numerics, self.kernels)
        return self.o_proj(out.reshape(num_tokens, q_size))


class MLP(nn.Module):
    kernels: Kernels = DEFAULT_KERNELS  # set_kernels chooses per model

    def __init__(self, config: ModelConfig, numerics: Numerics, dtype: torch.dtype):
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, numerics, dtype)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, numerics, dtype)
        self.numerics = numerics

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        act = silu_and_mul(self.gate_up_proj(hidden), fused=self.kernels.fused_ops, numerics=self.numerics)
        return self.down_proj(act)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, numerics: Numerics, dtype: torch.dtype):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = Attention(config, rotary, numerics, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = MLP(config, numerics, dtype)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata, cache: LayerKVCache
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn(positions, self.input_layernorm(hidden), meta, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def forward_fused(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        delta: torch.Tensor | None,
        meta: AttentionMetadata,
        cache: LayerKVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The same layer with each residual add fused into the norm after it (triton_ops.py): takes
        the previous layer's output as `hidden + delta` and returns its own the same way."""
        if delta is None:
            normed = self.input_layernorm(hidden)
        else:
            hidden, normed = triton_ops.add_rms_norm(hidden, delta, self.input_layernorm.weight, self.input_layernorm.eps)
        attn = self.self_attn(positions, normed, meta, cache)
        post = self.post_attention_layernorm
        hidden, normed = triton_ops.add_rms_norm(hidden, attn, post.weight, post.eps)
        return hidden, self.mlp(normed)
