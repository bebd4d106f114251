"""The decoder-only transformer (Llama family and Qwen3) over a paged KV cache."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from refengine.model import ops, triton_ops
from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.config import DEFAULT_KERNELS, Kernels, ModelConfig, Numerics
from refengine.model.decoder_layer import DecoderLayer
from refengine.model.errors import ModelInputError
from refengine.model.kv_cache import KVCache
from refengine.model.layers import Linear, RMSNorm, RotaryEmbedding
from refengine.model.packed_weight import PackedWeight


@dataclass(frozen=True, slots=True)
class ModelOutput:
    """`hidden_states[T, H]` after the final norm; `aux_hidden_states[i]` is layer i's output."""

    hidden_states: torch.Tensor
    aux_hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)


class Transformer(nn.Module):
    kernels: Kernels = DEFAULT_KERNELS  # set_kernels chooses per model

    def __init__(
        self,
        config: ModelConfig,
        numerics: Numerics = Numerics.BATCH_INVARIANT,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.config = config
        self.numerics = numerics
        rotary = RotaryEmbedding.from_config(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(
            DecoderLayer(config, rotary, numerics, dtype) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else Linear(config.hidden_size, config.vocab_size, numerics, dtype)
        )
        # The tied output projection's packed copy of the embedding (a separate lm_head has its own).
        self.packed_tied_lm_head = PackedWeight()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Callers that build ids on the host (drafters) may hand them over there.
        return self.embed_tokens(input_ids.to(self.embed_tokens.weight.device))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        capture_layers: tuple[int, ...] = (),
    ) -> ModelOutput:
        if input_ids.shape != positions.shape or input_ids.dim() != 1:
            raise ModelInputError(
                f"input_ids {tuple(input_ids.shape)} and positions {tuple(positions.shape)} must be equal 1-D"
            )
        if len(kv_cache.layers) != len(self.layers):
            raise ModelInputError(f"KV cache has {len(kv_cache.layers)} layers, model has {len(self.layers)}")
        bad = [i for i in capture_layers if not 0 <= i < len(self.layers)]
        if bad:
            raise ModelInputError(f"capture_layers {bad} outside 0..{len(self.layers) - 1}")
        hidden = self.embed(input_ids)
        aux: dict[int, torch.Tensor] = {}
        if triton_ops.use_fused(hidden, self.kernels.fused_ops):
            # GPU: residual adds fused into the following norms; a layer's output is hidden + delta.
            delta = None
            for index, (layer, cache) in enumerate(zip(self.layers, kv_cache.layers, strict=True)):
                hidden, delta = layer.forward_fused(positions, hidden, delta, meta, cache)
                if index in capture_layers:
                    aux[index] = hidden + delta
            if delta is None:
                return ModelOutput(hidden_states=self.norm(hidden), aux_hidden_states=aux)
            _, normed = triton_ops.add_rms_norm(hidden, delta, self.norm.weight, self.norm.eps)
            return ModelOutput(hidden_states=normed, aux_hidden_states=aux)
        for index, (layer, cache) in enumerate(zip(self.layers, kv_cache.layers, strict=True)):
            hidden = layer(positions, hidden, meta, cache)
            if index in capture_layers:
                aux[index] = hidden
        return ModelOutput(hidden_states=self.norm(hidden), aux_hidden_states=aux)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`hidden[N, H]` -> float32 `logits[N, vocab]`."""
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        return ops.linear(
            hidden, self.embed_tokens.weight, self.numerics, self.packed_tied_lm_head, skinny=self.kernels.skinny_gemm
        ).float()
