"""Driving a Transformer directly in tests: one or several sequences over a private KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from refengine.model import KVCache, Transformer
from refengine.model.attention_metadata_builder import build_attention_metadata

BLOCK_SIZE = 4


def new_cache(model: Transformer, num_blocks: int = 256) -> KVCache:
    return KVCache.allocate(model.config, num_blocks, BLOCK_SIZE, dtype=model.embed_tokens.weight.dtype)


def step(
    model: Transformer,
    cache: KVCache,
    seqs: Sequence[tuple[Sequence[int], int, Sequence[int]]],
    causal: bool = True,
) -> list[torch.Tensor]:
    """One forward step. Each entry is (new token ids, tokens already cached, block ids); returns the
    float32 logits of each sequence's new rows."""
    meta = build_attention_metadata(
        [computed for _, computed, _ in seqs],
        [len(ids) for ids, _, _ in seqs],
        [blocks for _, _, blocks in seqs],
        BLOCK_SIZE,
        causal=causal,
    )
    input_ids = torch.tensor([t for ids, _, _ in seqs for t in ids], dtype=torch.long)
    positions = torch.tensor(
        [computed + j for ids, computed, _ in seqs for j in range(len(ids))], dtype=torch.long
    )
    with torch.inference_mode():
        logits = model.compute_logits(model(input_ids, positions, meta, cache).hidden_states)
    bounds = meta.query_start_loc.tolist()
    return [logits[bounds[i] : bounds[i + 1]] for i in range(len(seqs))]


def blocks_for(num_tokens: int, first_block: int = 0) -> list[int]:
    return list(range(first_block, first_block + -(-num_tokens // BLOCK_SIZE)))


def prefill_logits(
    model: Transformer, ids: Sequence[int], block_ids: Sequence[int] | None = None
) -> torch.Tensor:
    cache = new_cache(model)
    return step(model, cache, [(ids, 0, block_ids if block_ids is not None else blocks_for(len(ids)))])[0]


def chunked_logits(model: Transformer, ids: Sequence[int], chunk: int) -> torch.Tensor:
    """The same sequence fed `chunk` tokens per step."""
    cache = new_cache(model)
    blocks = blocks_for(len(ids))
    return torch.cat(
        [
            step(model, cache, [(ids[start : start + chunk], start, blocks)])[0]
            for start in range(0, len(ids), chunk)
        ]
    )


def greedy(
    model: Transformer, prompt: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int]
) -> list[int]:
    """Prefill, then one token per step, argmax each time; stops after a stop id."""
    cache = new_cache(model, num_blocks=-(-(len(prompt) + max_new_tokens) // BLOCK_SIZE))
    blocks = blocks_for(len(prompt) + max_new_tokens)
    logits = step(model, cache, [(prompt, 0, blocks)])[0][-1]
    out: list[int] = []
    while True:
        token = int(logits.argmax())
        out.append(token)
        if token in stop_ids or len(out) == max_new_tokens:
            return out
        logits = step(model, cache, [([token], len(prompt) + len(out) - 1, blocks)])[0][-1]
