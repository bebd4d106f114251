"""Exact values at the edges of the runner's acceptance and logprobs: the synthetic acceptance draws
(speed studies), logprobs with and without top tokens, a bad word whose prefix is the very first
token, and min_tokens counted per verify row."""

import math

import pytest
import torch

from refengine.engine.arg_utils import EngineArgs
from refengine.engine.engine_args import build_engine
from refengine.sample import rng
from refengine.sample.metadata import RowParams
from refengine.worker.request_state import CachedRequestState
from refengine.worker.step_rows import ScheduledRow
from refengine.worker.synthetic_acceptance import STREAM_SYNTHETIC_ACCEPT, synthetic_num_accepted
from refengine.worker.verify_step import token_logprobs, verify_rows
from tests.sample.reference_verify import verify


@pytest.fixture(scope="module")
def runner():
    engine = build_engine(EngineArgs(model="tiny-qwen3", num_blocks=16, max_model_len=64))
    yield engine.runner
    engine.core.shutdown()


@pytest.mark.parametrize(
    ("rate", "key", "expected"),
    # Counts read off the counter RNG's draws at positions 10.. of stream 101 (key 3: .33 .57 .51 .98;
    # key 7: .69 .46 .03 .06 .91): they pin the position each draft draws at, not only the rate.
    [(0.7, 3, 3), (0.5, 3, 1), (0.7, 7, 4), (0.3, 7, 0), (1.0, 7, 6), (0.0, 7, 0)],
)
def test_synthetic_acceptance_counts_are_exact(rate, key, expected):
    assert synthetic_num_accepted(rate, key, 10, (4,) * 6) == expected


def test_synthetic_acceptance_token_zero_is_a_draft_and_minus_one_is_not():
    """Token id 0 is a real draft (accepted at rate 1); a -1 placeholder always rejects, even at rate 1."""
    assert synthetic_num_accepted(1.0, 7, 10, (0, 0, 0)) == 3
    assert synthetic_num_accepted(1.0, 7, 10, (0, -1, 0)) == 1
    assert synthetic_num_accepted(1.0, 7, 10, (-1,)) == 0


def test_synthetic_draw_equal_to_the_rate_rejects():
    """Accepted with probability `rate`: a draw u accepts iff u < rate, so u == rate rejects."""
    draw = rng.uniform(7, 10, STREAM_SYNTHETIC_ACCEPT)
    assert synthetic_num_accepted(draw, 7, 10, (4, 4)) == 0
    assert synthetic_num_accepted(math.nextafter(draw, 1.0), 7, 10, (4,)) == 1


def test_token_logprobs_exact_values_and_top_tokens():
    # Probabilities 1/8, 2/8, 5/8: exact logprobs, top tokens most likely first.
    logits = torch.log(torch.tensor([[1.0, 2.0, 5.0], [1.0, 2.0, 5.0]]))
    out = token_logprobs(logits, [0, 2], num_top=2)
    assert [o.token_id for o in out] == [0, 2]
    assert out[0].logprob == pytest.approx(math.log(1 / 8))
    assert out[1].logprob == pytest.approx(math.log(5 / 8))
    assert [i for i, _ in out[0].top] == [2, 1]
    assert [v for _, v in out[0].top] == pytest.approx([math.log(5 / 8), math.log(2 / 8)])


def test_token_logprobs_without_top_tokens():
    """logprobs=0 asks for the sampled token's logprob only: no top list."""
    out = token_logprobs(torch.log(torch.tensor([[1.0, 3.0]])), [1], num_top=0)
    assert out[0].top == []
    assert out[0].logprob == pytest.approx(math.log(3 / 4))


def _one_row(runner, params, history, num_prompt, drafts, logits):
    # The sampling parameters reach the sampler through the request's persistent batch row.
    state = CachedRequestState("r", len(history), num_prompt, len(history) - 1, (0,), params, None)
    runner.input_batch.add_request(state, history)
    try:
        batch_row = runner.input_batch.req_id_to_index["r"]
        row = ScheduledRow(state, batch_row, len(history) - 1, 1 + len(drafts), 0, drafts, 0)
        out = verify_rows(runner.input_batch, runner.accept, logits, [row], {"r": drafts})
    finally:
        runner.input_batch.remove_request("r")
    return [t for t in out[0].tolist() if t != -1]


def _logits(*rows: dict[int, float], vocab: int = 12) -> torch.Tensor:
    out = torch.full((len(rows), vocab), -5.0)
    for r, scores in enumerate(rows):
        for tok, v in scores.items():
            out[r, tok] = v
    return out


def test_bad_word_prefix_at_the_first_token_is_seen(runner):
    """The bad-words history tail starts at position 0 when the context is shorter than the tail: a
    word (2, 3) after the one-token context [2] bans 3, so the runner takes the runner-up 4."""
    params = RowParams(0.0, 0, 1.0, 0, (), ((2, 3),), rng_key=1)
    logits = _logits({3: 5.0, 4: 4.0})
    got = _one_row(runner, params, [2], 1, (), logits)
    assert got == [4] == verify(logits, (), params, [2], 0, first_position=1)


def test_min_tokens_counts_the_drafts_before_each_row(runner):
    """min_tokens=2 with one output so far: the stop token 7 is masked at the first verify row and
    allowed at the second (one accepted draft later), as spec-off decoding would see it."""
    params = RowParams(0.0, 0, 1.0, 2, (7,), (), rng_key=1)
    logits = _logits({5: 5.0, 7: 6.0}, {7: 5.0, 6: 4.0})
    got = _one_row(runner, params, [1, 2, 3], 2, (5,), logits)
    assert got == [5, 7] == verify(logits, (5,), params, [1, 2, 3], 1, first_position=3)


def test_seeded_rows_after_an_accepted_draft_draw_at_their_own_position(runner):
    """A seeded row's draw is keyed by its position: row j of a verify decides position num_tokens + j,
    the same draw spec-off decoding makes there. The first draft is certain to be accepted (a peaked
    row), so the flat second row must draw at position 4, not at the first row's position 3."""
    params = RowParams(1.0, 0, 1.0, 0, (), (), rng_key=5)
    logits = torch.zeros(2, 12)
    logits[0, 6] = 40.0
    got = _one_row(runner, params, [1, 2, 3], 2, (6,), logits)
    assert got == verify(logits, (6,), params, [1, 2, 3], 1, first_position=3)
    assert len(got) == 2 and got[0] == 6
