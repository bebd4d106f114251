"""What one forward step tells the attention op about its sequences (passed explicitly, no global).
The runner and the drafters build it with refengine.model.attention_metadata_builder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """The token batch is the concatenation of each sequence's new tokens.

        query_start_loc  [0, q0, q0+q1, ...]      rows of sequence b: query_start_loc[b]:query_start_loc[b+1]
        seq_lens         [s0, s1, ...]            keys 0..s_b-1 are valid once this step's K/V are written
        block_tables     [B, max_blocks]          key position j lives in block block_tables[b, j // block_size]
        slot_mapping     [T]                      where token t's K/V go: block * block_size + offset; -1 = nowhere

    The new tokens of sequence b are its last q_b positions, `s_b - q_b .. s_b - 1`.
    causal=True: a row at position p sees keys 0..p. causal=False: it sees every key < s_b.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    causal: bool = True
    # What an attention implementation derives from the fields above (attention.py's fast plan): the
    # first layer of a step computes it, the others reuse it. Never passed in, compared or copied (`to`,
    # dataclasses.replace): a new metadata starts empty.
    derived: dict[Any, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> AttentionMetadata:
        """The same metadata with its tensors on `device` (from pinned memory the copies are async)."""
        return AttentionMetadata(
            query_start_loc=self.query_start_loc.to(device, non_blocking=non_blocking),
            seq_lens=self.seq_lens.to(device, non_blocking=non_blocking),
            block_tables=self.block_tables.to(device, non_blocking=non_blocking),
            slot_mapping=self.slot_mapping.to(device, non_blocking=non_blocking),
            causal=self.causal,
        )

    def pin_memory(self) -> AttentionMetadata:
        return AttentionMetadata(
            query_start_loc=self.query_start_loc.pin_memory(),
            seq_lens=self.seq_lens.pin_memory(),
            block_tables=self.block_tables.pin_memory(),
            slot_mapping=self.slot_mapping.pin_memory(),
            causal=self.causal,
        )
