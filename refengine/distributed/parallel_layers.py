"""The sharded layers of a tensor-parallel decoder, named as vLLM and nano-vllm name them, and
`shard_model`, which builds a rank's shard of a loaded Transformer (the loaded model is left whole:
drafters and the oracle's checks read it). QKV and gate/up are column-parallel, o_proj and down
row-parallel, the embedding and LM head vocab-parallel.

Design: docs/design/architecture.md (tensor parallelism). Invariant numbers refer to docs/invariants.md.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from refengine.distributed.parallel_state import NUM_TP_INVARIANT_SLICES, TensorParallelConfigError, TPGroup
from refengine.model import ops
from refengine.model.config import DEFAULT_KERNELS, Kernels, ModelConfig, Numerics
from refengine.model.layers import Linear
from refengine.model.packed_weight import PackedWeight
from refengine.model.transformer import Transformer


class ColumnParallelLinear(Linear):
    """A Linear holding this rank's output rows: no communication."""


class RowParallelLinear(nn.Module):
    """`x[T, K/tp] @ weight[N, K/tp].T`, summed over ranks.

    Plain: one all-reduce, whose order of addition is the backend's and depends on the TP size.
    TP-invariant (invariant 46): K is cut into NUM_TP_INVARIANT_SLICES slices whatever the TP size; each
    slice's product is computed alone, the slices summed pairwise in a binary tree. A rank's slices are a
    subtree of that tree, so each rank sums its subtree, the subtrees are all-gathered, and the tree is
    finished in rank order: the same additions in the same order as at TP=1 (TBIK, arXiv 2511.17826). No
    all-reduce, fused all-reduce + norm or message-size-chosen algorithm takes part in the sum."""

    kernels: Kernels = DEFAULT_KERNELS  # set_kernels chooses per model

    def __init__(self, weight: torch.Tensor, numerics: Numerics, group: TPGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.numerics = numerics
        self.group = group
        self.packed = PackedWeight()
        if group.invariant:
            out_features, k_local = weight.shape
            num_local = NUM_TP_INVARIANT_SLICES // group.world_size
            if k_local % num_local:
                raise TensorParallelConfigError(
                    f"tp_invariant: {k_local * group.world_size} input features do not split into "
                    f"{NUM_TP_INVARIANT_SLICES} slices"
                )
            # [slices, N, K / slices], each slice contiguous, as the same slice is at every TP size
            slices = weight.reshape(out_features, num_local, k_local // num_local).transpose(0, 1).contiguous()
            self.register_buffer("slices", slices, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.group.invariant:
            return self.group.all_reduce(
                ops.linear(x, self.weight, self.numerics, self.packed, skinny=self.kernels.skinny_gemm)
            )
        width = self.slices.shape[2]
        skinny = self.kernels.skinny_gemm
        partials = [
            ops.linear(x[:, i * width : (i + 1) * width].contiguous(), w, self.numerics, skinny=skinny)
            for i, w in enumerate(self.slices)
        ]
        return tree_sum(self.group.all_gather(tree_sum(partials)))


def tree_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """Pairwise, level by level: ((p0 + p1) + (p2 + p3)) + ... for a power-of-two count."""
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] for i in range(0, len(parts), 2)]
    return parts[0]


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of the embedding; a token another rank owns embeds as zeros here."""

    def __init__(self, weight: torch.Tensor, group: TPGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.group = group
        self.vocab_start = group.rank * weight.shape[0]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start
        owned = (local >= 0) & (local < self.weight.shape[0])
        rows = nn.functional.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)
        # Exact whatever the order: one rank adds the row, the others zeros.
        return self.group.all_reduce(rows * owned.unsqueeze(-1).to(rows.dtype))


class ParallelLMHead(nn.Module):
    """This rank's vocabulary slice of the output projection; the slices are gathered (not summed, so
    exact) into every rank's full float32 logits row."""

    kernels: Kernels = DEFAULT_KERNELS  # set_kernels chooses per model

    def __init__(self, weight: torch.Tensor, numerics: Numerics, group: TPGroup) -> None:
        super().__init__()
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight.contiguous(), requires_grad=False)
        self.numerics = numerics
        self.group = group

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = ops.linear(hidden, self.weight, self.numerics, skinny=self.kernels.skinny_gemm).float()
        return torch.cat(self.group.all_gather(logits), dim=-1)


def local_config(config: ModelConfig, tp: int) -> ModelConfig:
    """The shapes one rank holds: its heads, KV heads and intermediate columns (the KV cache is
    allocated from this, so it is sharded by KV head)."""
    return dataclasses.replace(
        config,
        num_attention_heads=config.num_attention_heads // tp,
        num_key_value_heads=config.num_key_value_heads // tp,
        intermediate_size=config.intermediate_size // tp,
    )


def shard_model(model: Transformer, group: TPGroup) -> Transformer:
    """A new Transformer holding `group.rank`'s shard of `model`'s weights (at world size 1, in the
    TP-invariant mode, the whole model with its row-parallel products summed in the fixed tree)."""
    config, tp, r = model.config, group.world_size, group.rank
    # Shares every parameter with `model` (the memo maps each to itself); only the sharded ones are new.
    shard = copy.deepcopy(model, memo={id(p): p for p in model.parameters()})
    shard.config = local_config(config, tp)
    q_local, kv_local, i_local = config.q_size // tp, config.kv_size // tp, config.intermediate_size // tp

    def rows(weight: torch.Tensor, start: int, size: int) -> torch.Tensor:
        return weight[start + r * size : start + (r + 1) * size]

    for layer, full in zip(shard.layers, model.layers, strict=True):
        attn, mlp = layer.self_attn, layer.mlp
        qkv = full.self_attn.qkv_proj.weight
        attn.qkv_proj = _column(
            torch.cat([rows(qkv, 0, q_local), rows(qkv, config.q_size, kv_local),
                       rows(qkv, config.q_size + config.kv_size, kv_local)]),
            model.numerics,
        )
        attn.num_heads, attn.num_kv_heads = config.num_attention_heads // tp, config.num_key_value_heads // tp
        attn.o_proj = RowParallelLinear(
            full.self_attn.o_proj.weight[:, r * q_local : (r + 1) * q_local], model.numerics, group
        )
        gate_up = full.mlp.gate_up_proj.weight
        mlp.gate_up_proj = _column(
            torch.cat([rows(gate_up, 0, i_local), rows(gate_up, config.intermediate_size, i_local)]), model.numerics
        )
        mlp.down_proj = RowParallelLinear(
            full.mlp.down_proj.weight[:, r * i_local : (r + 1) * i_local], model.numerics, group
        )
    vocab_local = config.vocab_size // tp
    shard.embed_tokens = VocabParallelEmbedding(rows(model.embed_tokens.weight, 0, vocab_local), group)
    head = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    shard.lm_head = ParallelLMHead(
        shard.embed_tokens.weight if model.lm_head is None else rows(head, 0, vocab_local), model.numerics, group
    )
    return shard


def _column(weight: torch.Tensor, numerics: Numerics) -> ColumnParallelLinear:
    layer = ColumnParallelLinear(weight.shape[1], weight.shape[0], numerics, weight.dtype)
    layer.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    return layer
