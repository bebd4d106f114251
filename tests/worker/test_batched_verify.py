"""The runner's batched verify (one pass of the batched rejection sampler over every request of a step,
on the logits' device) against the per-request reference `verify` (tests/sample/reference_verify.py),
row for row: greedy and seeded, with drafts that match, miss, match again after a miss, -1
placeholders, bad words and min_tokens; hand-built rows, then random mixed batches with k up to 4,
one-hot through the runner and with draft probabilities through the sampler."""

import pytest
import torch

from refengine.engine.arg_utils import EngineArgs
from refengine.engine.engine_args import build_engine
from refengine.sample.metadata import RowParams, SamplingMetadata
from refengine.sample.rejection_sampler import SpecDecodeMetadata, draft_row_masks, rejection_sample
from refengine.worker.request_state import CachedRequestState
from refengine.worker.step_rows import ScheduledRow
from refengine.worker.verify_step import verify_rows
from tests.sample.reference_verify import verify


@pytest.fixture(scope="module")
def runner():
    engine = build_engine(EngineArgs(model="tiny-qwen3", num_blocks=16, max_model_len=64, max_num_seqs=len(CASES)))
    yield engine.core.runner
    engine.core.shutdown()


def one_hot(ids: list[int], vocab: int = 12) -> torch.Tensor:
    out = torch.full((len(ids), vocab), -5.0)
    for row, tok in enumerate(ids):
        out[row, tok] = 5.0
    return out


GREEDY = RowParams(0.0, 0, 1.0, 0, (), (), rng_key=7)
# (params, history, drafts, logits): each request's k + 1 rows.
CASES = [
    (GREEDY, [1, 2], (1, 2, 3), one_hot([1, 2, 3, 4])),  # all accepted: bonus
    (GREEDY, [1, 2], (1, 9, 3), one_hot([1, 2, 3, 4])),  # a miss, then a match that must not count
    (GREEDY, [1, 2], (9, 2, 3), one_hot([1, 2, 3, 4])),  # first draft wrong
    (GREEDY, [1, 2], (-1, -1), one_hot([5, 6, 7])),  # placeholders never accepted
    (GREEDY, [1, 2], (), one_hot([8])),  # no drafts
    (RowParams(0.0, 0, 1.0, 0, (), ((2, 3),), rng_key=1), [0], (2, 3), one_hot([2, 3, 1])),  # bad word after a draft
    (RowParams(0.7, 0, 1.0, 3, (7,), (), rng_key=3), [0, 1], (4, 5), torch.randn(3, 12, generator=torch.Generator().manual_seed(1))),
    (RowParams(0.9, 4, 0.8, 0, (), (), rng_key=11), [3], (6,), torch.randn(2, 12, generator=torch.Generator().manual_seed(2))),
]  # fmt: skip


def test_batched_verify_equals_the_per_request_reference(runner):
    rows, logits, expected = [], [], []
    first = 0
    for i, (params, history, drafts, rows_logits) in enumerate(CASES):
        state = CachedRequestState(f"r{i}", len(history), 1, len(history) - 1, (0,), params, None)
        row = runner.input_batch.add_request(state, history)
        rows.append(ScheduledRow(state, row, len(history) - 1, 1 + len(drafts), first, drafts, first))
        logits.append(rows_logits)
        first += len(drafts) + 1
        expected.append(verify(rows_logits, drafts, params, history, len(history) - 1, first_position=len(history)))
    try:
        out = verify_rows(runner.input_batch, runner.accept, torch.cat(logits), rows, {r.state.req_id: r.draft_ids for r in rows})
    finally:
        for r in rows:
            runner.input_batch.remove_request(r.state.req_id)
    got = [[t for t in row if t != -1] for row in out.tolist()]
    assert got == expected
    assert [len(t) for t in got[:5]] == [4, 2, 1, 1, 1]


def _random_requests(seed: int, num: int) -> list[tuple[RowParams, list[int], tuple[int, ...], torch.Tensor, torch.Tensor]]:
    """`num` random requests (params, history, drafts, k + 1 logits rows, [k, V] draft probabilities):
    k from 0 to 4, greedy and seeded rows with and without top-k, top-p, min_tokens and a bad word;
    drafts mostly drawn from their own q (so some are accepted), now and then a -1 placeholder."""
    g = torch.Generator().manual_seed(seed)

    def pick(n: int) -> int:
        return int(torch.randint(n, (1,), generator=g))

    out = []
    for r in range(num):
        k = pick(5)
        temperature = (0.0, 0.6, 1.0, 1.4)[pick(4)]
        params = RowParams(
            temperature,
            (0, 0, 3, 6)[pick(4)],
            (1.0, 1.0, 0.7)[pick(3)],
            pick(3),  # min_tokens
            (7,),
            (((2, 5),), ())[pick(2)],
            rng_key=seed * 1000 + r,
        )
        history = [int(t) for t in torch.randint(12, (1 + pick(3),), generator=g)]
        logits = torch.randn(k + 1, 12, generator=g) * 2
        # Half the drafters are close to the target (long accepted runs), half unlike it (rejections).
        near = logits[:k] + torch.randn(k, 12, generator=g) * 0.3
        q = torch.softmax(near if r % 2 else torch.randn(k, 12, generator=g) * 2, dim=-1)
        drafts = tuple(
            -1 if pick(8) == 0 else int(torch.multinomial(q[j], 1, generator=g)) for j in range(k)
        )
        out.append((params, history, drafts, logits, q))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_verification_with_draft_probs_equals_the_per_request_reference(seed):
    """Rejection sampling proper on a random mixed batch (k up to 4, draft probabilities): the batched
    sampler emits, request for request, what the per-request reference emits."""
    requests = _random_requests(seed, 24)
    width = max(len(d) for _, _, d, _, _ in requests)
    params, positions, masked, drafts, first_rows = [], [], [], [], []
    probs = torch.zeros(len(requests), width, 12)
    for r, (p, history, d, _, q) in enumerate(requests):
        first_rows.append(len(params))
        row_masks: list[list[int]] = [[] for _ in range(len(d) + 1)]
        for j, token in draft_row_masks(p, history, d, len(history) - 1):
            row_masks[j].append(token)
        params += [p] * (len(d) + 1)
        positions += range(len(history), len(history) + len(d) + 1)
        masked += row_masks
        drafts.append(list(d))
        probs[r, : len(d)] = q
    device = torch.device("cpu")
    md = SamplingMetadata.build(params, positions, masked, device)
    spec = SpecDecodeMetadata.build(drafts, first_rows, device, probs)
    out = rejection_sample(torch.cat([lg for _, _, _, lg, _ in requests]), md, spec)
    got = [[t for t in row if t != -1] for row in out.tolist()]
    expected = [
        verify(lg, d, p, h, len(h) - 1, first_position=len(h), draft_probs=q) for p, h, d, lg, q in requests
    ]
    assert got == expected
    # The batch ran every branch: a rejection, and a bonus after two or more accepted drafts.
    assert any(len(t) <= len(d) for t, (_, _, d, _, _) in zip(got, requests, strict=True))
    assert any(len(t) == len(d) + 1 and len(d) >= 2 for t, (_, _, d, _, _) in zip(got, requests, strict=True))


@pytest.mark.parametrize("seed", [4, 5])
def test_random_one_hot_rows_through_the_runner_equal_the_per_request_reference(runner, seed):
    """The runner's own verify path (one-hot drafts, k up to 4) on random mixed rows."""
    requests = _random_requests(seed, len(CASES))
    rows, first = [], 0
    for i, (params, history, drafts, _, _) in enumerate(requests):
        state = CachedRequestState(f"s{seed}-{i}", len(history), 1, len(history) - 1, (0,), params, None)
        row = runner.input_batch.add_request(state, history)
        rows.append(ScheduledRow(state, row, len(history) - 1, 1 + len(drafts), first, drafts, first))
        first += len(drafts) + 1
    try:
        out = verify_rows(runner.input_batch, runner.accept, torch.cat([lg for _, _, _, lg, _ in requests]), rows, {r.state.req_id: r.draft_ids for r in rows})
    finally:
        for r in rows:
            runner.input_batch.remove_request(r.state.req_id)
    got = [[t for t in row if t != -1] for row in out.tolist()]
    expected = [verify(lg, d, p, h, len(h) - 1, first_position=len(h)) for p, h, d, lg, _ in requests]
    assert got == expected
