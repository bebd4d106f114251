"""Batch-invariant numerics: a sequence's logits are bitwise the same alone, inside a batch of
others, and fed in chunks of any size."""

import random

import pytest
import torch
from model_drive import blocks_for, chunked_logits, new_cache, prefill_logits, step

from refengine.model import LoadedModel, build_tiny_model


def _random_prompts(rng: random.Random, vocab_size: int, count: int, max_len: int) -> list[list[int]]:
    return [[rng.randrange(vocab_size) for _ in range(rng.randint(1, max_len))] for _ in range(count)]


def _in_batch(model, prompts: list[list[int]]) -> list[torch.Tensor]:
    cache = new_cache(model)
    seqs, first_block = [], 0
    for ids in prompts:
        blocks = blocks_for(len(ids), first_block)
        first_block += len(blocks)
        seqs.append((ids, 0, blocks))
    return step(model, cache, seqs)


def test_alone_batched_and_chunked_are_bitwise_equal(tiny_model: LoadedModel) -> None:
    rng = random.Random(tiny_model.config.arch.value)
    model = tiny_model.model
    prompts = _random_prompts(rng, tiny_model.config.vocab_size, 8, 40)
    batched = _in_batch(model, prompts)
    for index, (ids, in_batch) in enumerate(zip(prompts, batched, strict=True)):
        alone = prefill_logits(model, ids)
        assert torch.equal(alone, in_batch), f"prompt {index} alone vs in a batch of 8"
        if index < 3:  # chunked feeding costs a step per chunk: three prompts suffice
            for chunk in (1, 3, 8):
                assert torch.equal(alone, chunked_logits(model, ids, chunk)), f"prompt {index}, chunk {chunk}"


def test_decode_rows_do_not_depend_on_their_batch(tiny_model: LoadedModel) -> None:
    """A decode row next to a long prefill gives the same logits as the same decode row alone."""
    model = tiny_model.model
    rng = random.Random(7)
    ids = [rng.randrange(tiny_model.config.vocab_size) for _ in range(21)]
    other = [rng.randrange(tiny_model.config.vocab_size) for _ in range(37)]
    alone = prefill_logits(model, ids)[-1]
    cache = new_cache(model)
    blocks, other_blocks = blocks_for(len(ids)), blocks_for(len(other), 100)
    step(model, cache, [(ids[:-1], 0, blocks)])
    decode_row = step(model, cache, [(other, 0, other_blocks), (ids[-1:], len(ids) - 1, blocks)])[1][0]
    assert torch.equal(alone, decode_row)


def test_fast_mode_agrees_closely_but_fails_the_bitwise_check() -> None:
    """Plain batched kernels change bits with the batch shape (BLAS picks gemv for one row, gemm for
    many), so the bitwise comparisons above do catch a model that is not batch invariant."""
    invariant = build_tiny_model("llama", seed=3)
    fast = build_tiny_model("llama", seed=3, numerics="fast")
    ids = list(range(5, 60))
    a, b = prefill_logits(invariant.model, ids), prefill_logits(fast.model, ids)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
    assert not torch.equal(b, chunked_logits(fast.model, ids, 1))


@pytest.mark.model
def test_smollm2_alone_batched_and_chunked_are_bitwise_equal(smollm2: LoadedModel) -> None:
    rng = random.Random(11)
    model = smollm2.model
    prompts = _random_prompts(rng, smollm2.config.vocab_size, 8, 12)
    target = prompts[0] = smollm2.tokenizer.encode("The quick brown fox jumps over the lazy dog, again!")
    alone = prefill_logits(model, target)
    assert torch.equal(alone, _in_batch(model, prompts)[0])
    for chunk in (1, 3, 8):
        assert torch.equal(alone, chunked_logits(model, target, chunk)), f"chunk {chunk}"
