"""The decoder layer drafter heads are built from: the target's layer, with a configurable input width
and optional per-head q/k norms, over the head's own paged KV.

EAGLE3's first layer attends over [embeds | hidden] (2H wide); DFlash's Qwen3-style layers normalise
each q and k head, and also write K/V for context rows that have no query of their own.
"""

import torch
from torch import nn

from refengine.model.attention import paged_attention
from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.config import DEFAULT_KERNELS, Kernels, ModelConfig, Numerics
from refengine.model.decoder_layer import MLP, fused_norm_rope, fuses_norm_rope
from refengine.model.kv_cache import LayerKVCache
from refengine.model.layers import Linear, RMSNorm, RotaryEmbedding
from refengine.model.ops import linear


class DraftAttention(nn.Module):
    kernels: Kernels = DEFAULT_KERNELS  # set_kernels chooses per model

    def __init__(
        self,
        config: ModelConfig,
        in_features: int,
        rotary: RotaryEmbedding,
        numerics: Numerics,
        dtype: torch.dtype,
        *,
        qk_norm: bool,
    ) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.kv_size = config.kv_size
        self.numerics = numerics
        self.qkv_proj = Linear(in_features, config.q_size + 2 * config.kv_size, numerics, dtype)
        self.o_proj = Linear(config.q_size, config.hidden_size, numerics, dtype)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype) if qk_norm else None
        self.rotary = rotary

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata, cache: LayerKVCache
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k, v = self._shape_kv(k, v)
        if fuses_norm_rope(q, self.kernels):
            # One launch where the unfused rotary is some ten kernels: each draft pass pays it again.
            q, k = fused_norm_rope(q, k, self.q_norm, self.k_norm, self.rotary, positions)
        else:
            if self.q_norm is not None:
                q = self.q_norm(q)
            q, k = self.rotary(positions, q, self._norm_k(k))
        out = paged_attention(q, k, v, cache, meta, self.head_dim**-0.5, self.numerics, self.kernels)
        return self.o_proj(out.reshape(num_tokens, self.q_size))

    def store_context(
        self, positions: torch.Tensor, context: torch.Tensor, meta: AttentionMetadata, cache: LayerKVCache
    ) -> None:
        """Write K/V for rows that are keys only (DFlash's context): the K/V rows of qkv_proj, k_norm
        and the rotary embedding at the rows' own positions, stored at meta.slot_mapping."""
        num_tokens = context.shape[0]
        kv_weight = self.qkv_proj.weight[self.q_size :]
        kv = linear(context, kv_weight, self.numerics, skinny=self.kernels.skinny_gemm)
        k, v = self._shape_kv(*kv.split([self.kv_size, self.kv_size], dim=-1))
        no_queries = k.new_zeros(num_tokens, self.num_heads, self.head_dim)
        _, k = self.rotary(positions, no_queries, self._norm_k(k))
        # paged_attention is the one op that knows the cache layout; only its store is wanted here, so
        # it runs with zero queries and its output is dropped.
        paged_attention(no_queries, k, v, cache, meta, self.head_dim**-0.5, self.numerics, self.kernels)

    def _shape_kv(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (k.shape[0], self.num_kv_heads, self.head_dim)
        return k.reshape(shape), v.reshape(shape)

    def _norm_k(self, k: torch.Tensor) -> torch.Tensor:
        return k if self.k_norm is None else self.k_norm(k)


class DraftDecoderLayer(nn.Module):
    """Attention then a SwiGLU MLP, each around a residual. The caller prepares the attention input
    (heads differ there: EAGLE skips the input norm of its first layer, EAGLE3 concatenates two normed
    streams), so `input_layernorm` is a part the caller applies, present only where the head has one."""

    def __init__(
        self,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        numerics: Numerics,
        dtype: torch.dtype,
        *,
        attn_in_features: int,
        input_norm: bool,
        qk_norm: bool,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype) if input_norm else None
        self.self_attn = DraftAttention(config, attn_in_features, rotary, numerics, dtype, qk_norm=qk_norm)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = MLP(config, numerics, dtype)

    def forward(
        self,
        positions: torch.Tensor,
        attn_input: torch.Tensor,
        residual: torch.Tensor,
        meta: AttentionMetadata,
        cache: LayerKVCache,
    ) -> torch.Tensor:
        hidden = residual + self.self_attn(positions, attn_input, meta, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def pre_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The attention input of an ordinary pre-norm layer."""
        return hidden if self.input_layernorm is None else self.input_layernorm(hidden)
