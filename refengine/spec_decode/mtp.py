"""A DeepSeek-style multi-token-prediction head.

h = eh_proj([enorm(embed(token at p + 1)) | hnorm(target hidden at p)]) -> one decoder layer
    -> shared_head.norm -> the target's lm_head.

Drafting reuses the one module for all k passes, as vLLM's EAGLE-style proposer does with an MTP
checkpoint: a checkpoint with several MTP layers contributes its first.
"""

import re

import torch
from torch import nn

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.config import ModelConfig, Numerics
from refengine.model.layers import Linear, RMSNorm, RotaryEmbedding
from refengine.spec_decode.draft_head import DraftHead
from refengine.spec_decode.draft_layer import DraftDecoderLayer

# Names of the MTP module's own tensors; everything else under its prefix is its decoder layer.
_OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.norm.")
# Copies of the target's embedding and lm_head that DeepSeek checkpoints repeat per MTP layer.
_SHARED = ("embed_tokens.weight", "shared_head.head.weight")
_DEEPSEEK_PREFIX = re.compile(r"^model\.layers\.(\d+)\.")


class MtpNetwork(DraftHead):
    def build(self, config: ModelConfig, numerics: Numerics, dtype: torch.dtype) -> None:
        hidden = config.hidden_size
        rotary = RotaryEmbedding.from_config(config)
        self.enorm = RMSNorm(hidden, config.rms_norm_eps, dtype)
        self.hnorm = RMSNorm(hidden, config.rms_norm_eps, dtype)
        self.eh_proj = Linear(2 * hidden, hidden, numerics, dtype)
        self.layer = DraftDecoderLayer(
            config, rotary, numerics, dtype, attn_in_features=hidden, input_norm=True, qk_norm=False
        )
        self.shared_head = nn.ModuleDict({"norm": RMSNorm(hidden, config.rms_norm_eps, dtype)})

    def forward(
        self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        x = self.eh_proj(torch.cat([self.enorm(self.target.embed(input_ids)), self.hnorm(hidden)], dim=-1))
        return self.layer(positions, self.layer.pre_norm(x), x, meta, self.kv_cache.layers[0])

    def greedy_tokens(self, out: torch.Tensor) -> torch.Tensor:
        return self.target.compute_logits(self.shared_head["norm"](out)).argmax(dim=-1)

    @staticmethod
    def parameter_name(checkpoint_name: str, first_layer: int | None = None) -> str | None:
        """DeepSeek puts MTP layer i under model.layers.{L + i}.; with `first_layer` = L only that
        module is used. Its decoder-layer tensors sit directly under the prefix (self_attn.*, mlp.*,
        the two layer norms); here they live under "layer."."""
        match = _DEEPSEEK_PREFIX.match(checkpoint_name)
        if match is not None:
            if first_layer is not None and int(match.group(1)) != first_layer:
                return None
            checkpoint_name = checkpoint_name[match.end() :]
        if checkpoint_name in _SHARED:
            return None
        if checkpoint_name.startswith(_OWN):
            return checkpoint_name
        return f"layer.{checkpoint_name}"

    @staticmethod
    def checkpoint_name(parameter_name: str) -> str:
        return parameter_name.removeprefix("layer.")


def first_mtp_layer(tensor_names: list[str]) -> int | None:
    """The lowest model.layers.N index in a DeepSeek-style MTP checkpoint (None: unprefixed names)."""
    indices = [int(m.group(1)) for m in map(_DEEPSEEK_PREFIX.match, tensor_names) if m is not None]
    return min(indices) if indices else None
