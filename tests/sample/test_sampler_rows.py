"""The sampler's row functions against their definitions: banned next tokens of bad words (one-token and
multi-token words, short histories), the masks of a row, and
probabilities_batch against the per-row reference of tests/sample/test_lossless_sampling.py (OpenAI's
and vLLM's temperature, top-k and top-p), edge cases included: greedy rows, top_k 0 or >= the
vocabulary (off), top_p 1.0 (off), ties, and the exact top_p boundary."""

import numpy as np
import pytest
import torch

from refengine.sample.bad_words import banned_next_tokens
from refengine.sample.metadata import RowParams, SamplingMetadata
from refengine.sample.sampler import masked_token_ids, probabilities_batch
from tests.sample.test_lossless_sampling import processed

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "history, bad_words, banned",
    [
        ([], [[5]], [5]),  # a one-token word is banned whatever came before
        ([1, 2], [[5], [7]], [5, 7]),
        ([1], [[2, 3]], []),  # a two-token word only after its first token
        ([1, 2], [[2, 3]], [3]),
        ([], [[2, 3]], []),
        ([0, 1, 2], [[1, 2, 3]], [3]),  # a three-token word after its two-token prefix
        ([2], [[1, 2, 3]], []),  # a history shorter than the prefix
        ([1, 0, 2], [[1, 2, 3]], []),
        ([4, 1, 2], [[1, 2, 3], [9, 2, 6], [2, 8], [1, 8], [4]], [3, 8, 4]),
    ],
)
def test_banned_next_tokens(history, bad_words, banned):
    assert banned_next_tokens(history, bad_words) == banned


def test_masked_token_ids_are_the_bad_words_and_below_min_tokens_the_stops():
    params = RowParams(1.0, 0, 1.0, 2, (7, 8), ((5,), (1, 6)), rng_key=0)
    assert masked_token_ids(params, [3, 1], 1) == [5, 6, 7, 8]
    assert masked_token_ids(params, [3, 1], 2) == [5, 6]  # min_tokens reached: stops are allowed
    assert masked_token_ids(params, [3], 0) == [5, 7, 8]


def _probabilities(logits: torch.Tensor, rows: list[tuple[float, int, float]]) -> torch.Tensor:
    params = [RowParams(t, k, p, 0, (), (), rng_key=i) for i, (t, k, p) in enumerate(rows)]
    md = SamplingMetadata.build(params, range(len(rows)), [[]] * len(rows), CPU)
    return probabilities_batch(logits, md)


def _reference(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The definitions: temperature 0 (greedy) rows come out at temperature 1, top_k <= 0 or >= the
    vocabulary is off."""
    vocab = logits.shape[-1]
    return processed(logits.double().numpy(), temperature or 1.0, top_k if 0 < top_k < vocab else 0, top_p)


def test_probabilities_batch_follows_the_definitions_row_by_row():
    vocab = 10
    rows = [
        (temperature, top_k, top_p)
        for temperature in (0.0, 0.6, 1.0, 1.7)
        for top_k in (0, -1, 1, 3, vocab - 1, vocab, vocab + 5)
        for top_p in (1.0, 0.9, 0.3)
    ]
    logits = torch.randn(len(rows), vocab, generator=torch.Generator().manual_seed(3)) * 2
    got = _probabilities(logits, rows).double().numpy()
    for row, (want_row, got_row) in enumerate(zip((_reference(logits[i], *r) for i, r in enumerate(rows)), got)):
        assert np.allclose(got_row, want_row, atol=1e-6), f"row {row} {rows[row]}"
        # The same support: a filter that is off must not drop a token, however small its mass.
        assert np.array_equal(got_row > 0, want_row > 0), f"row {row} {rows[row]}"


def test_top_k_keeps_the_ties_at_the_kth_value():
    logits = torch.tensor([[1.0, 3.0, 1.0, 0.0, 1.0, 3.0]])
    got = _probabilities(logits, [(1.0, 3, 1.0)])[0]
    assert (got > 0).tolist() == [True, True, True, False, True, True]
    assert np.allclose(got.numpy(), _reference(logits[0], 1.0, 3, 1.0), atol=1e-7)


def test_top_p_one_is_off_even_where_the_head_holds_all_the_float32_mass():
    """Token 0 holds 1 - 1.4e-8 of the mass, 1.0 in float32: with top_p = 1.0 the tail is still
    kept (a batch with another top_p row, so the top-p path runs)."""
    logits = torch.full((2, 8), -20.0)
    logits[:, 0] = 0.0
    got = _probabilities(logits, [(1.0, 0, 1.0), (1.0, 0, 0.5)])
    assert float(torch.softmax(logits[0], dim=-1)[0]) == 1.0
    assert bool((got[0] > 0).all())
    assert got[1].tolist() == [1.0] + [0.0] * 7


def test_top_p_stops_where_the_mass_reaches_it_and_breaks_ties_by_token_id():
    """Uniform rows, where every partial sum is exact in float32: top_p 0.5 keeps exactly the half of
    the vocabulary with the lowest ids (the mass before token 2 of 4 is 0.5, which reaches top_p)."""
    for vocab in (4, 1024):
        got = _probabilities(torch.zeros(1, vocab), [(1.0, 0, 0.5)])[0]
        half = vocab // 2
        assert got.tolist() == [1.0 / half] * half + [0.0] * half, f"vocab {vocab}"
