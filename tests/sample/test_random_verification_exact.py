"""Random verification (drafts with probabilities) through the batched rejection sampler, on hand-built rows: the exact accepted prefix,
recovered and bonus tokens, and which seeded draw decides each. Positions and keys are chosen so that
using the wrong draw (another position) changes the output.

Setup: vocab 8, every target row uniform (p = 1/8 everywhere), two drafts [0, 3] at first position 5.
Draft row 0 is uniform too, so p(0)/q(0) = 1 and draft 0 (token id 0, a real token) is always
accepted. Draft row 1 puts q(3) = 1/4, so p(3)/q(3) = 1/2: draft 3 is accepted iff the accept
uniform of position 6 is at most 1/2.
"""

import pytest
import torch

from refengine.sample import rng
from refengine.sample.sampler import RowParams
from tests.sample.batched_verify import verify_batched as verify
from tests.sample.reference_verify import num_accepted_random, sample

V = 8
FIRST_POSITION = 5
LOGITS = torch.zeros(3, V)


def draft_probs() -> torch.Tensor:
    q = torch.full((2, V), 1.0 / V)
    q[1] = 0.75 / 7
    q[1, 3] = 0.25
    return q


def params(key: int) -> RowParams:
    return RowParams(1.0, 0, 1.0, 0, (), (), rng_key=key)


def test_ratio_equal_to_the_uniform_accepts():
    # The rule is p/q >= u: a tie accepts.
    assert num_accepted_random([3], [0.5], [0.5], [1.0]) == 1
    assert num_accepted_random([3, 4], [0.25, 0.25], [0.5, 0.5], [0.5, 0.6]) == 1


def test_all_accepted_emits_the_bonus_sampled_at_its_own_position():
    # Key 2: the accept uniform of position 6 is 0.35 (<= 1/2: accept), that of position 4 would be
    # 0.86 (reject), so the row-1 draw must be keyed by first_position + 1.
    assert rng.uniform(2, 6, rng.STREAM_ACCEPT) < 0.5 < rng.uniform(2, 4, rng.STREAM_ACCEPT)
    out = verify(LOGITS, [0, 3], params(2), [1], 0, FIRST_POSITION, draft_probs=draft_probs())
    # The bonus is the target's own sample at position 7 (= 3 for key 2; position 3 would give 0).
    assert out == [0, 3, 3]
    assert sample(LOGITS[2], params(2), FIRST_POSITION + 2) == 3
    assert sample(LOGITS[2], params(2), FIRST_POSITION - 2) == 0


def test_rejection_recovers_at_the_rejected_position():
    # Key 3: the accept uniform of position 6 is 0.75 (> 1/2: reject draft 3). The recovered token is
    # drawn from max(0, p - q) at position 6: 6 for key 3 (position 4 would give 5), never 3.
    assert rng.uniform(3, 6, rng.STREAM_ACCEPT) > 0.5
    out = verify(LOGITS, [0, 3], params(3), [1], 0, FIRST_POSITION, draft_probs=draft_probs())
    assert out == [0, 6]


@pytest.mark.parametrize("key", [0, 1, 2])
def test_placeholder_draft_is_rejected_and_recovered_from_the_target(key):
    # A -1 draft has no probability to subtract: the token comes from the target alone, which here
    # puts all its mass on token 4.
    logits = torch.full((2, V), -1e4)
    logits[:, 4] = 0.0
    out = verify(logits, [-1], params(key), [1], 0, FIRST_POSITION, draft_probs=torch.full((1, V), 1.0 / V))
    assert out == [4]


def test_empty_residual_falls_back_to_the_target():
    # q >= p everywhere (q need not be normalised) leaves max(0, p - q) all zero: the recovered token
    # is then drawn from p itself, here all on token 5 (a zero residual would yield token 0).
    # Draft 3 has p(3) = 0, so it is rejected.
    logits = torch.full((2, V), -1e4)
    logits[:, 5] = 0.0
    assert verify(logits, [3], params(1), [1], 0, FIRST_POSITION, draft_probs=torch.ones(1, V)) == [5]
