"""The runner's batched verify (one pass over every request of a step, on the logits' device) against
the per-request reference `rejection.verify`, row for row: greedy and seeded, with drafts that match,
miss, match again after a miss, -1 placeholders, bad words and min_tokens."""

import pytest
import torch

from refengine.engine.arg_utils import EngineArgs
from refengine.engine.engine_args import build_engine
from refengine.sample.metadata import RowParams
from refengine.worker.model_runner import ScheduledRow
from refengine.worker.request_state import CachedRequestState
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
        state = CachedRequestState(f"r{i}", list(history), 1, len(history) - 1, (0,), params, None)
        row = runner.input_batch.add_request(state)
        rows.append(ScheduledRow(state, row, len(history) - 1, 1 + len(drafts), first, drafts, first))
        logits.append(rows_logits)
        first += len(drafts) + 1
        expected.append(verify(rows_logits, drafts, params, history, len(history) - 1, first_position=len(history)))
    out = runner._verify(torch.cat(logits), rows, {r.state.req_id: r.draft_ids for r in rows})
    got = [[t for t in row if t != -1] for row in out.tolist()]
    assert got == expected
    assert [len(t) for t in got[:5]] == [4, 2, 1, 1, 1]
