"""DFlash: block drafting from the target's context features.

Every committed position's target features become one context row, kept as keys and values in each head
layer's paged KV; the query block [t, mask x k] attends over the context and itself, and the target's
lm_head gives all k drafts in one pass, replayed from one CUDA graph per padded batch size. A context
whose length does not match the rows ingested raises DraftContextError before its drafts are used.
Design: docs/design/spec-decode.md (the drafters).
"""

from typing import Protocol

import torch
from torch import nn

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.attention_metadata_builder import uniform_query_metadata
from refengine.model.config import ModelConfig, Numerics
from refengine.model.kv_cache import KVCache
from refengine.model.layers import Linear, RMSNorm, RotaryEmbedding
from refengine.spec_decode.draft_head import DraftHead
from refengine.spec_decode.draft_layer import DraftDecoderLayer
from refengine.spec_decode.fixed_shape_proposer import FixedShapeProposer
from refengine.spec_decode.proposer import PaddedDraftBatch, ProposalInputs
from refengine.spec_decode.target_view import TargetView


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The DFlash default: the middle layer for a one-layer head, else num_draft_layers layers spread
    evenly over 1..L-3."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


class BlockDraftNetwork(Protocol):
    """A DFlash head as the drafter drives it (the teacher drafter in the tests stands in here)."""

    @property
    def capture_layers(self) -> tuple[int, ...]:
        """The target layers whose outputs, concatenated in this order, are the context features."""
        ...

    @property
    def mask_token_id(self) -> int: ...

    def combine(self, features: torch.Tensor) -> torch.Tensor:
        """Context features of committed rows -> context rows."""
        ...

    def store_context(self, context: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> None:
        """Make the context rows keys and values at their positions (meta.slot_mapping)."""
        ...

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """The query block, attending over each request's context (non-causal meta)."""
        ...

    def greedy_tokens(self, out: torch.Tensor) -> torch.Tensor: ...


class DFlashNetwork(DraftHead):
    """Qwen3-style layers (q/k norms), as the DFlash checkpoints are; embedding and lm_head are the
    target's."""

    def __init__(
        self,
        target: TargetView,
        config: ModelConfig,
        kv_cache: KVCache,
        target_layer_ids: tuple[int, ...],
        mask_token_id: int,
        numerics: Numerics = Numerics.BATCH_INVARIANT,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(target, config, kv_cache, numerics, dtype)
        hidden = config.hidden_size
        rotary = RotaryEmbedding.from_config(config)
        self.capture_layers = target_layer_ids
        self.mask_token_id = mask_token_id
        self.fc = Linear(len(target_layer_ids) * hidden, hidden, numerics, dtype)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps, dtype)
        self.layers = nn.ModuleList(
            DraftDecoderLayer(
                config, rotary, numerics, dtype, attn_in_features=hidden, input_norm=True, qk_norm=True
            )
            for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(hidden, config.rms_norm_eps, dtype)

    def combine(self, features: torch.Tensor) -> torch.Tensor:
        return self.hidden_norm(self.fc(features))

    def store_context(self, context: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> None:
        # The same context rows feed every layer; the layers never update them.
        for layer, cache in zip(self.layers, self.kv_cache.layers, strict=True):
            layer.self_attn.store_context(positions, context, meta, cache)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        h = self.target.embed(input_ids)
        for layer, cache in zip(self.layers, self.kv_cache.layers, strict=True):
            h = layer(positions, layer.pre_norm(h), h, meta, cache)
        return h

    @staticmethod
    def parameter_name(checkpoint_name: str) -> str | None:
        name = checkpoint_name.removeprefix("model.")
        return None if name in ("embed_tokens.weight", "lm_head.weight") else name


class DFlashProposer(FixedShapeProposer):
    method = "dflash"
    network: BlockDraftNetwork
    reads_hidden = False
    # The block needs slots and positions last_position + 1 .. last_position + 1 + n.
    extra_slots = 2

    def ingest(self, batch: PaddedDraftBatch, positions: torch.Tensor, meta: AttentionMetadata) -> None:
        """Every fed row's context keys and values at its position; a rejected row's lie past the
        committed context, where the query block (or the next step's context) overwrites them first."""
        features = torch.cat([batch.aux_hidden_states[i] for i in self.network.capture_layers], dim=-1)
        self.network.store_context(
            self.network.combine(torch.cat([features[d.rows] for d in batch.requests])), positions, meta
        )

    def draft(self, inputs: ProposalInputs) -> torch.Tensor:
        """Every request's query block [t, mask x k] at positions starts .. starts + k; block rows 1..k give
        the drafts. A request that wants n < k drafts has only t and n masks real: its other rows write
        no KV, its keys end after its real rows, and their drafts are dropped, so every block has the
        batch's shape."""
        num_seqs = inputs.num_seqs
        k = self.k
        ids = torch.cat([inputs.tokens[:, None], inputs.tokens.new_full((num_seqs, k), self.network.mask_token_id)], dim=1)
        meta, positions = uniform_query_metadata(
            inputs.starts,
            torch.where(inputs.num_drafts > 0, inputs.num_drafts + 1, 0),
            inputs.block_tables,
            self.block_size,
            num_query=k + 1,
            causal=False,
        )
        out = self.network.forward(ids.flatten(), positions, meta)
        return self.network.greedy_tokens(out.view(num_seqs, k + 1, -1)[:, 1:].flatten(0, 1)).view(num_seqs, k)
