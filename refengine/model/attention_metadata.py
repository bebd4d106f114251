"""What one forward step tells the attention op about its sequences (passed explicitly, no global)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from refengine.model.errors import ModelInputError


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

    @classmethod
    def build(
        cls,
        num_computed_tokens: Sequence[int],
        num_new_tokens: Sequence[int],
        block_ids: Sequence[Sequence[int]],
        block_size: int,
        causal: bool = True,
    ) -> AttentionMetadata:
        """Metadata for sequences whose first `num_computed_tokens[b]` tokens are already cached."""
        if not len(num_computed_tokens) == len(num_new_tokens) == len(block_ids):
            raise ModelInputError("one num_computed_tokens, num_new_tokens and block_ids entry per sequence")
        starts = [0]
        slots: list[int] = []
        for computed, new, blocks in zip(num_computed_tokens, num_new_tokens, block_ids, strict=True):
            if -(-(computed + new) // block_size) > len(blocks):
                raise ModelInputError(
                    f"{computed + new} tokens do not fit in {len(blocks)} blocks of {block_size}"
                )
            starts.append(starts[-1] + new)
            for position in range(computed, computed + new):
                slots.append(blocks[position // block_size] * block_size + position % block_size)
        max_blocks = max((len(blocks) for blocks in block_ids), default=0)
        # One tensor from padded rows (a tensor per row costs more than the rows themselves).
        padded = [[*blocks, *([-1] * (max_blocks - len(blocks)))] for blocks in block_ids]
        table = torch.tensor(padded, dtype=torch.int64).reshape(len(block_ids), max_blocks)
        return cls(
            query_start_loc=torch.tensor(starts, dtype=torch.int64),
            seq_lens=torch.tensor(
                [c + n for c, n in zip(num_computed_tokens, num_new_tokens, strict=True)], dtype=torch.int64
            ),
            block_tables=table,
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            causal=causal,
        )
