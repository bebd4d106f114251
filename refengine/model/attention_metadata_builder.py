"""Builds a step's AttentionMetadata from the scheduler's view of each sequence, kept apart from the
dataclass the model reads. The runner and the drafters both build theirs here, so it sits in model/,
below both: the drafters (spec_decode/) never import the runner (worker/) (tests/test_layering.py).

The arithmetic is array arithmetic over the step's tokens (numpy on the host): no Python loop over the
tokens or over a sequence's blocks, so its cost does not grow with the context.
"""

from collections.abc import Sequence

import numpy as np
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
    table, num_blocks = padded_block_table(block_ids)
    meta, _, _ = metadata_from_table(
        np.asarray(num_computed_tokens, dtype=np.int64),
        np.asarray(num_new_tokens, dtype=np.int64),
        table,
        num_blocks,
        block_size,
        causal,
    )
    return meta


def padded_block_table(block_ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """[B, max blocks] with -1 past each sequence's blocks, and each sequence's number of blocks."""
    num_blocks = np.fromiter((len(blocks) for blocks in block_ids), dtype=np.int64, count=len(block_ids))
    # One array from padded rows; each row is copied in one C call.
    table = np.full((len(block_ids), int(num_blocks.max(initial=0))), -1, dtype=np.int64)
    for row, blocks in enumerate(block_ids):
        table[row, : len(blocks)] = blocks
    return table, num_blocks


def metadata_from_table(
    num_computed_tokens: np.ndarray,
    num_new_tokens: np.ndarray,
    block_table: np.ndarray,
    num_blocks: np.ndarray,
    block_size: int,
    causal: bool = True,
) -> tuple[AttentionMetadata, np.ndarray, np.ndarray]:
    """Metadata for sequences given as arrays: `block_table[b, :num_blocks[b]]` holds sequence b's
    blocks (-1 after them). Also returns each token's position and its sequence's index, for the caller
    to gather the input ids."""
    seq_lens = num_computed_tokens + num_new_tokens
    short = np.flatnonzero(-(-seq_lens // block_size) > num_blocks)
    if short.size:
        b = int(short[0])
        raise ModelInputError(f"{seq_lens[b]} tokens do not fit in {num_blocks[b]} blocks of {block_size}")
    ends = np.cumsum(num_new_tokens)
    seq_of_token = np.repeat(np.arange(len(num_new_tokens)), num_new_tokens)
    positions = num_computed_tokens[seq_of_token] + np.arange(int(num_new_tokens.sum())) - (ends - num_new_tokens)[seq_of_token]
    slots = block_table[seq_of_token, positions // block_size] * block_size + positions % block_size
    meta = AttentionMetadata(
        query_start_loc=torch.from_numpy(np.concatenate(([0], ends)).astype(np.int64)),
        seq_lens=torch.from_numpy(seq_lens),
        block_tables=torch.from_numpy(block_table),
        slot_mapping=torch.from_numpy(slots),
        causal=causal,
    )
    return meta, positions, seq_of_token


def uniform_query_metadata(
    first_positions: torch.Tensor,
    num_valid: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
    num_query: int,
    causal: bool = True,
) -> tuple[AttentionMetadata, torch.Tensor]:
    """Metadata, and each token's position, for B sequences that each feed `num_query` tokens from
    `first_positions[b]`, built with tensor ops on the tensors' device: nothing is read back to the
    host, so a CUDA graph can capture it, and the drafters' eager loops run the very same code.

    Token j of sequence b is real when j < num_valid[b]; the rest write no KV (slot -1) and sit at
    position 0 (so a padded row past the position table indexes nothing out of range). A sequence with
    num_valid 0 is padding: seq_len 0, so it attends over nothing. A real sequence's seq_len ends
    after its last real token. For sequences whose tokens are all real this is exactly what
    build_attention_metadata gives for the same positions and blocks.

    Causal attention places a sequence's query rows at its last positions (seq_len - q ..), so with
    causal=True a sequence must be all real or all padding (num_valid num_query or 0); non-causal rows
    all see seq_len keys, so there a block may end in rows past its real ones (DFlash's).
    """
    num_seqs = first_positions.shape[0]
    device = first_positions.device
    offsets = torch.arange(num_query, device=device)
    real = offsets[None, :] < num_valid[:, None]  # [B, q]
    positions = torch.where(real, first_positions[:, None] + offsets[None, :], 0)
    blocks = block_tables.gather(1, positions // block_size)
    slots = torch.where(real, blocks * block_size + positions % block_size, -1)
    meta = AttentionMetadata(
        query_start_loc=torch.arange(num_seqs + 1, device=device) * num_query,
        seq_lens=torch.where(num_valid > 0, first_positions + num_valid, 0),
        block_tables=block_tables,
        slot_mapping=slots.flatten(),
        causal=causal,
    )
    return meta, positions.flatten()
