"""A drafter's whole step after a uniform verify step (pass 1 over k + 1 fed rows per request, then the
proposal), as its CUDA graph runs it, run eagerly on the CPU: filled into the static buffers and padded,
it drafts exactly what the eager proposal drafts, and rows past the step's requests (an earlier, larger
step's) want no drafts and write no KV. Capture and replay are checked on a GPU (tests/gpu)."""

import pytest
import torch

from refengine.model import KVCache
from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.draft_graphs import DraftGraphs
from refengine.spec_decode.proposer import DraftInput, PaddedDraftBatch
from refengine.spec_decode.registry import KVLayout, build_proposer

BLOCK_SIZE = 4
K = 3
TOKENS = [11, 42, 7, 99, 150, 3, 77, 21, 64, 5, 18, 230]
BLOCKS = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)]


def _step(target, drafter, num_requests: int, num_rejected: list[int]) -> PaddedDraftBatch:
    """Each request feeds K + 1 rows at positions 0..K (its own slice of TOKENS), all proposing, with
    `num_rejected` of its rows rejected."""
    q = K + 1
    meta = build_attention_metadata([0] * num_requests, [q] * num_requests, [list(b) for b in BLOCKS[:num_requests]], BLOCK_SIZE)
    ids = torch.tensor([TOKENS[i + j] for i in range(num_requests) for j in range(q)])
    positions = torch.arange(q).repeat(num_requests)
    cache = KVCache.allocate(target.config, 16, BLOCK_SIZE)
    with torch.inference_mode():
        out = target.model(ids, positions, meta, cache, capture_layers=drafter.capture_layers)
    requests = tuple(
        DraftInput(f"r{i}", TOKENS[i : i + q + 1], 0, q, slice(i * q, (i + 1) * q), BLOCKS[i], True)
        for i in range(num_requests)
    )
    next_ids = torch.tensor([TOKENS[i + j + 1] for i in range(num_requests) for j in range(q)])
    return PaddedDraftBatch(
        requests, next_ids, torch.tensor(num_rejected), out.hidden_states, out.aux_hidden_states, positions, meta
    )


def _limit(batch: PaddedDraftBatch, drafter) -> torch.Tensor:
    return torch.tensor([min(len(d.block_ids) * BLOCK_SIZE, drafter.max_positions) for d in batch.requests])


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp", "dflash"])
def test_the_filled_step_drafts_as_the_eager_proposal_and_pads_with_nothing(tiny4, method):
    spec = SpeculativeConfig(method, K)
    eager = build_proposer(spec, tiny4, KVLayout(16, BLOCK_SIZE))
    stepped = build_proposer(spec, tiny4, KVLayout(16, BLOCK_SIZE))
    target_hidden = (tiny4.config.hidden_size, torch.float32)
    graphs = DraftGraphs(stepped, target_hidden, max_blocks_per_seq=4, batch_sizes=[2, 4], device=torch.device("cpu"))
    with torch.inference_mode():
        # An earlier, larger step fills every row; then a step of two requests pads up to four.
        wide = _step(tiny4, stepped, 4, [0, 1, 2, 3])
        graphs.fill_step(wide, _limit(wide, stepped), padded=4)
        graphs.step(4)
        batch = _step(tiny4, eager, 2, [1, 3])
        # Nothing is captured on the CPU, so nothing replays.
        assert not graphs.steps.holds(4)
        expected = eager.propose(batch)
        graphs.fill_step(batch, _limit(batch, stepped), padded=4)
        drafts = graphs.step(4)
    assert torch.equal(drafts[:2], expected)
    assert (expected >= 0).any()  # the variant drafted something to compare
    # The padded rows want no drafts: -1 throughout, and no KV written for them.
    assert drafts[2:].tolist() == [[-1] * K] * 2
    assert graphs.step_buffers["slots"][2 * (K + 1) : 4 * (K + 1)].tolist() == [-1] * 2 * (K + 1)
