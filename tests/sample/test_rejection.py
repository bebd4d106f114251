"""The engine's batched rejection sampler on one request at a time (tests/sample/batched_verify.py):
greedy, one-hot and random verification, constraints per row, and the target distribution. The index
helpers of the per-request reference (the oracle of tests/worker/test_batched_verify.py) are pinned too."""

import numpy as np
import pytest
import torch

from refengine.sample import rng
from refengine.sample.sampler import RowParams, apply_constraints
from tests.sample.batched_verify import verify_batched as verify
from tests.sample.batched_verify import verify_many
from tests.sample.reference_verify import (
    assemble,
    num_accepted_greedy,
    num_accepted_random,
    pad_rows,
    probabilities,
    sample,
)

GREEDY = RowParams(0.0, 0, 1.0, 0, (), (), rng_key=7)


def one_hot_logits(ids: list[int], vocab: int = 8) -> torch.Tensor:
    out = torch.full((len(ids), vocab), -5.0)
    for row, tok in enumerate(ids):
        out[row, tok] = 5.0
    return out


@pytest.mark.parametrize(
    "drafts, target, expected",
    [
        ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4]),  # perfect match: bonus appended
        ([1, 5, 3], [1, 2, 3, 4], [1, 2]),  # early mismatch: stop, emit the target token
        ([6, 5, 3], [1, 2, 3, 4], [1]),  # first draft wrong
        ([1, 2, 6], [1, 2, 3, 4], [1, 2, 3]),  # last draft wrong: recovered, no bonus
        ([], [4], [4]),  # no drafts: bonus only
        ([-1, -1], [0, 0, 0], [0]),  # a -1 placeholder is always rejected
    ],
)
def test_greedy_verify(drafts, target, expected):
    assert verify(one_hot_logits(target), drafts, GREEDY, [0], 0, 10) == expected


def test_index_functions():
    assert num_accepted_greedy([1, 2, 3], [1, 9, 3, 4]) == 1
    assert num_accepted_greedy([1, 2], [1, 2, 0]) == 2
    assert assemble([1, 2, 3], 1, 9) == [1, 9]
    assert pad_rows([[1, 2], [3], [4, 5, 6]], 3) == [[1, 2, -1], [3, -1, -1], [4, 5, 6]]
    assert num_accepted_random([3, 4], [0.5, 0.5], [0.5, 0.25], [0.9, 0.1]) == 2
    assert num_accepted_random([3, 4], [0.2, 0.5], [0.5, 0.25], [0.5, 0.1]) == 0
    assert num_accepted_random([3, -1], [0.9, 0.9], [0.5, 0.5], [0.0, 0.0]) == 1
    assert num_accepted_random([3], [0.9], [0.0], [0.0]) == 0  # q(d) = 0 never accepts


def test_bad_words_see_drafts_before_the_row():
    # Banned [2, 3]: row 1 follows draft 2, so 3 is masked there and the runner-up wins.
    logits = one_hot_logits([2, 3, 1])
    logits[1, 5] = 4.0
    params = RowParams(0.0, 0, 1.0, 0, (), ((2, 3),), rng_key=1)
    assert verify(logits, [2, 3], params, [0], 0, 10) == [2, 5]


@pytest.mark.parametrize("temperature", [0.0, 0.5])
def test_min_tokens_counts_the_drafts_before_each_row(temperature):
    """Stop id 7 is the target's first choice on every row, and 4 and 5 its runners-up. One output
    exists and min_tokens is 3, so rows 0 and 1 (outputs 1 and 2) must mask the stop and row 2 (output
    3) may emit it: drafts [4, 5] are accepted and the stop follows them, as without speculation."""
    logits = torch.full((3, 8), -30.0)
    logits[:, 7] = 30.0
    logits[0, 4] = logits[1, 5] = 20.0
    params = RowParams(temperature, 0, 1.0, 3, (7,), (), rng_key=3)
    assert verify(logits, [4, 5], params, [0, 1], 1, 10) == [4, 5, 7]


def test_seeded_random_verify_is_deterministic():
    torch.manual_seed(0)
    logits = torch.randn(3, 16)
    params = RowParams(0.8, 0, 1.0, 0, (), (), rng_key=1234)
    first = verify(logits, [3, 4], params, [1, 2], 0, 5)
    for _ in range(5):
        assert verify(logits, [3, 4], params, [1, 2], 0, 5) == first


def _races(weights: torch.Tensor, keys: range, position: int, stream: int) -> list[int]:
    """race(weights, key, position, stream) for every key, in one batch: the same draws."""
    key_words = rng.key_word(np.array(list(keys), dtype=np.uint64)).astype(np.int64)
    seeds = torch.from_numpy(rng.row_seeds(key_words, position, stream))
    return torch.argmax(weights / rng.exponentials(seeds, weights.numel()), dim=-1).tolist()


def _first_token_distribution(target: torch.Tensor, draft: torch.Tensor, trials: int) -> torch.Tensor:
    """Emitted-token histogram at the first position: draft from q, verify against p (k = 1), one seeded
    request per trial, all in one batch."""
    logits = torch.stack([target.log(), target.log()])
    params = [RowParams(1.0, 0, 1.0, 0, (), (), rng_key=key) for key in range(trials)]
    drafts = [[d] for d in _races(draft, range(trials), 0, stream=99)]
    out = verify_many(logits, drafts, params, 0, draft_probs=draft[None])
    return torch.bincount(out[:, 0], minlength=target.numel()) / trials


def test_random_verification_reproduces_the_target_distribution():
    """Recovering from p instead of max(0, p - q) moves this TV above 0.08 (M15 shows it)."""
    p = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    q = torch.tensor([0.4, 0.1, 0.3, 0.1, 0.1])
    assert torch.allclose(probabilities(p.log(), RowParams(1.0, 0, 1.0, 0, (), (), 0)), p, atol=1e-6)
    tv = 0.5 * (_first_token_distribution(p, q, 6000) - p).abs().sum().item()
    assert tv < 0.03, f"spec sampling drifted from the target: TV={tv:.4f}"


def _two_position_distribution(p: torch.Tensor, q: torch.Tensor, trials: int, one_hot: bool) -> torch.Tensor:
    """Joint histogram of the tokens at positions 0 and 1, both decided by the same target row p (the
    rows do not depend on the tokens before them here, so the target's joint is p x p). Two drafts are
    drawn from q per step; a step that ends after one token is followed by a plain step at position 1."""
    logits = p.log().expand(3, -1)
    params = [RowParams(1.0, 0, 1.0, 0, (), (), rng_key=key) for key in range(trials)]
    drafts = [list(pair) for pair in zip(*(_races(q, range(trials), j, stream=99) for j in range(2)), strict=True)]
    out = verify_many(logits, drafts, params, 0, draft_probs=None if one_hot else q.expand(2, -1))
    short = (out[:, 1] == -1).nonzero()[:, 0]
    second = out[:, 1].clone()
    second[short] = verify_many(logits[:1], [[]] * len(short), [params[i] for i in short.tolist()], 1)[:, 0]
    return torch.bincount(out[:, 0] * p.numel() + second, minlength=p.numel() ** 2).view(p.numel(), -1) / trials


# Fixed keys, so the histograms are deterministic; 4000 trials put the clean total variation near 0.015,
# and each named mutant (a shared draw across the rows of one step) above 0.05.
P3 = torch.tensor([0.6, 0.3, 0.1])
Q3 = torch.tensor([0.2, 0.3, 0.5])


def test_rejection_sampling_of_two_drafts_reproduces_the_target_distribution():
    """The draft_probs path with k = 2: the two acceptance uniforms of one step must be independent, or
    the second draft is accepted whenever the first was (given u < r1, u < r2 is likelier than r2)."""
    tv = 0.5 * (_two_position_distribution(P3, Q3, 4000, one_hot=False) - torch.outer(P3, P3)).abs().sum().item()
    assert tv < 0.035, f"two-draft rejection sampling drifted from the target: TV={tv:.4f}"


def test_one_hot_verification_of_two_drafts_reproduces_the_target_distribution():
    """The path every drafter of the engine takes at temperature > 0: one-hot drafts, accepted when they
    equal the target's seeded sample at their position. Rows of one step must draw independent noise."""
    tv = 0.5 * (_two_position_distribution(P3, Q3, 4000, one_hot=True) - torch.outer(P3, P3)).abs().sum().item()
    assert tv < 0.035, f"one-hot verification drifted from the target: TV={tv:.4f}"


@pytest.mark.parametrize("bad_words", [(), ((3, 5),)])
def test_seeded_one_hot_verification_emits_the_spec_off_tokens(bad_words):
    """Seeded spec-on output equals spec-off output token for token, whatever the drafts: the step emits
    the spec-off samples at its positions, up to and including the first draft that differs from them."""
    torch.manual_seed(0)
    num_compared = 0
    for key in range(60):
        logits = torch.randn(4, 16) * 2
        params = RowParams(0.8, 0, 1.0, 0, (), bad_words, rng_key=key)
        history = [1, 3]
        spec_off: list[int] = []
        for j in range(4):
            row = apply_constraints(logits[j], params, [*history, *spec_off], j)
            spec_off.append(sample(row, params, 10 + j))
        num_right = key % 4  # 0..3 drafts equal the spec-off tokens, then a wrong one (if any is left)
        drafts = spec_off[:num_right] + [(t + 1) % 16 for t in spec_off[num_right:3]]
        out = verify(logits, drafts, params, history, 0, first_position=10)
        assert out == spec_off[: num_right + 1], f"key {key}: drafts {drafts}"
        num_compared += len(out)
    assert num_compared > 100
