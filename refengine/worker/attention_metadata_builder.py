"""Builds a step's AttentionMetadata from the scheduler's view of each sequence: a runner concern (the
drafters build theirs the same way), kept apart from the dataclass the model reads."""

from collections.abc import Sequence

import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.errors import ModelInputError


def build_attention_metadata(
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
    return AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int64),
        seq_lens=torch.tensor(
            [c + n for c, n in zip(num_computed_tokens, num_new_tokens, strict=True)], dtype=torch.int64
        ),
        block_tables=table,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        causal=causal,
    )
