"""EAGLE and EAGLE3 heads, in vLLM's layout (Llama-style layers, no q/k norms).

EAGLE reads the target's final hidden state after its final norm; EAGLE3 reads three target layers'
outputs (low, middle, high) before any norm, and may carry its own lm_head over a reduced draft
vocabulary mapped back to target ids by d2t. Both return the pre-norm hidden, the next pass's input.
Design: docs/design/spec-decode.md (the drafters).
"""

import re

import torch
from torch import nn

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.config import ModelConfig, Numerics
from refengine.model.kv_cache import KVCache
from refengine.model.layers import Linear, RMSNorm, RotaryEmbedding
from refengine.spec_decode.draft_head import DraftHead
from refengine.spec_decode.draft_layer import DraftDecoderLayer
from refengine.spec_decode.head_checkpoint import HeadLoadError
from refengine.spec_decode.target_view import TargetView


class EagleNetwork(DraftHead):
    def build(self, config: ModelConfig, numerics: Numerics, dtype: torch.dtype) -> None:
        hidden = config.hidden_size
        rotary = RotaryEmbedding.from_config(config)
        self.fc = Linear(2 * hidden, hidden, numerics, dtype)
        self.layers = nn.ModuleList(
            DraftDecoderLayer(
                config, rotary, numerics, dtype, attn_in_features=hidden, input_norm=i > 0, qk_norm=False
            )
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(hidden, config.rms_norm_eps, dtype)

    def forward(
        self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        h = self.fc(torch.cat([self.target.embed(input_ids), hidden], dim=-1))
        for layer, cache in zip(self.layers, self.kv_cache.layers, strict=True):
            h = layer(positions, layer.pre_norm(h), h, meta, cache)
        return h

    @staticmethod
    def parameter_name(checkpoint_name: str) -> str | None:
        """vLLM's EAGLE checkpoints name tensors fc.*, layers.N.*, norm.*, sometimes under "model."; a
        copy of the target's embedding, if present, is not used (the head shares the target's)."""
        name = checkpoint_name.removeprefix("model.")
        return None if name == "embed_tokens.weight" else name


class Eagle3MidLayer(DraftDecoderLayer):
    """EAGLE3's single layer: the decoder layer plus the norm of the incoming hidden stream."""

    def __init__(
        self, config: ModelConfig, rotary: RotaryEmbedding, numerics: Numerics, dtype: torch.dtype
    ) -> None:
        super().__init__(
            config,
            rotary,
            numerics,
            dtype,
            attn_in_features=2 * config.hidden_size,
            input_norm=True,
            qk_norm=False,
        )
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)


def eagle3_capture_layers(aux_layer_ids: tuple[int, ...], num_target_layers: int) -> tuple[int, ...]:
    """vLLM names EAGLE3's aux layers by the layer whose *input* it captures (default
    (2, L // 2, L - 3)); that input is the previous layer's output, which is what the runner captures."""
    capture = tuple(i - 1 for i in aux_layer_ids)
    if not all(0 <= i < num_target_layers for i in capture):
        raise HeadLoadError(
            f"eagle3 aux hidden-state layers {list(aux_layer_ids)} need inputs of layers 1..{num_target_layers - 1} "
            f"of a {num_target_layers}-layer target"
        )
    return capture


def default_eagle3_aux_layer_ids(num_target_layers: int) -> tuple[int, int, int]:
    return (2, num_target_layers // 2, num_target_layers - 3)


class Eagle3Network(DraftHead):
    def __init__(
        self,
        target: TargetView,
        config: ModelConfig,
        kv_cache: KVCache,
        aux_layer_ids: tuple[int, ...],
        num_target_layers: int,
        numerics: Numerics = Numerics.BATCH_INVARIANT,
        dtype: torch.dtype = torch.float32,
        *,
        draft_vocab_size: int | None = None,
    ) -> None:
        """`draft_vocab_size` None: drafts come from the target's lm_head; otherwise the head has its
        own lm_head over that many tokens and a d2t map (identity until loaded)."""
        super().__init__(target, config, kv_cache, numerics, dtype)
        hidden = config.hidden_size
        if config.num_hidden_layers != 1:
            raise HeadLoadError(
                f"eagle3 heads have one layer here, config asks for {config.num_hidden_layers}"
            )
        self.capture_layers = eagle3_capture_layers(aux_layer_ids, num_target_layers)
        self.aux_layer_ids = aux_layer_ids
        self.fc = Linear(len(aux_layer_ids) * hidden, hidden, numerics, dtype)
        self.layers = nn.ModuleList([Eagle3MidLayer(config, RotaryEmbedding.from_config(config), numerics, dtype)])
        self.norm = RMSNorm(hidden, config.rms_norm_eps, dtype)
        self.lm_head = None
        if draft_vocab_size is not None:
            self.lm_head = Linear(hidden, draft_vocab_size, numerics, dtype)
            self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))

    def combine(self, target_hidden: torch.Tensor) -> torch.Tensor:
        return self.fc(target_hidden)

    def forward(
        self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        layer = self.layers[0]
        embeds = layer.pre_norm(self.target.embed(input_ids))
        attn_input = torch.cat([embeds, layer.hidden_norm(hidden)], dim=-1)
        return layer(positions, attn_input, hidden, meta, self.kv_cache.layers[0])

    def greedy_tokens(self, out: torch.Tensor) -> torch.Tensor:
        normed = self.norm(out)
        if self.lm_head is None:
            return self.target.compute_logits(normed).argmax(dim=-1)
        draft_ids = self.lm_head(normed).argmax(dim=-1)
        return draft_ids + self.d2t[draft_ids]

    def load_vocab_map(self, tensors: dict[str, torch.Tensor], origin: str) -> None:
        """d2t is an offset table, not a parameter; t2d (the reverse mask) is not needed for drafting."""
        if self.lm_head is None:
            return
        d2t = tensors.get("d2t")
        if d2t is None:
            if self.d2t.shape[0] == self.target.vocab_size:
                return  # an own lm_head over the full vocabulary: draft ids are target ids
            raise HeadLoadError(f"{origin}: own lm_head over a draft vocabulary but no 'd2t' tensor")
        if tuple(d2t.shape) != tuple(self.d2t.shape):
            raise HeadLoadError(
                f"{origin}: tensor 'd2t' has shape {tuple(d2t.shape)}, expected {tuple(self.d2t.shape)}"
            )
        target_ids = torch.arange(len(d2t)) + d2t.long()
        if target_ids.min() < 0 or target_ids.max() >= self.target.vocab_size:
            raise HeadLoadError(f"{origin}: 'd2t' maps draft ids outside the target vocabulary")
        self.d2t.copy_(d2t.long())

    @staticmethod
    def parameter_name(checkpoint_name: str) -> str | None:
        name = checkpoint_name.removeprefix("model.")
        if name in ("d2t", "t2d", "embed_tokens.weight"):
            return None  # d2t loads through load_vocab_map; the embedding is the target's
        return re.sub(r"^midlayer\.", "layers.0.", name)

    @staticmethod
    def checkpoint_name(parameter_name: str) -> str:
        return re.sub(r"^layers\.0\.", "midlayer.", parameter_name)
