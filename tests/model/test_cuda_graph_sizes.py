"""The bucketing of batch sizes into captured CUDA graphs, on the CPU: what the target's and the
drafters' graph replays choose on a GPU. Every replay takes the smallest captured size that holds the
batch it has now: a batch that grows between steps never replays the smaller graph of an earlier step
(its static buffers would cut the new requests off), and one that shrinks gets the smaller graph."""

import pytest
import torch

from refengine.model.graphs import MAX_MIXED_TOKENS, default_batch_sizes, graph_token_sizes, padded_batch_size
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.draft_graphs import DraftGraphs
from refengine.spec_decode.proposer import ProposalInputs
from refengine.spec_decode.registry import KVLayout, build_proposer


@pytest.mark.parametrize("captured", [[1, 2, 4, 8], [8, 1, 4, 2], [4], [3, 6, 16]])
def test_every_batch_replays_the_smallest_captured_size_that_holds_it(captured):
    for num_seqs in range(1, max(captured) + 3):
        fits = [b for b in captured if b >= num_seqs]
        assert padded_batch_size(num_seqs, captured) == (min(fits) if fits else None), num_seqs


def test_a_batch_that_grows_and_shrinks_gets_a_fresh_size_each_step():
    """Steps of 1, 3, 2, 6, 5 and 9 requests over graphs of 1, 2, 4 and 8: each step's own bucket, and
    eager (None) past the largest graph; the sizes of a dict of captured graphs count as its keys."""
    graphs = {8: "g8", 1: "g1", 4: "g4", 2: "g2"}
    assert [padded_batch_size(n, graphs) for n in (1, 3, 2, 6, 5, 9)] == [1, 4, 2, 8, 8, None]


def test_default_batch_sizes():
    assert default_batch_sizes(1) == [1]
    assert default_batch_sizes(8) == [1, 2, 4, 8]
    assert default_batch_sizes(32) == [1, 2, 4, 8, 16, 24, 32]
    assert default_batch_sizes(30) == [1, 2, 4, 8, 16, 24, 30]


def test_a_proposal_padded_to_its_bucket_keeps_its_rows_and_pads_with_rows_that_want_no_drafts(tiny4):
    drafter = build_proposer(SpeculativeConfig("eagle", 3), tiny4, KVLayout(16, 16))
    size = tiny4.config.hidden_size
    graphs = DraftGraphs(drafter, (size, torch.float32), 3, [1, 2, 4, 8], torch.device("cpu"))
    for t in graphs.proposal_buffers.static.values():
        t.fill_(9)  # whatever an earlier, larger proposal left
    inputs = ProposalInputs(
        tokens=torch.tensor([5, 6, 7]),
        starts=torch.tensor([10, 20, 30]),
        num_drafts=torch.tensor([3, 1, 2]),
        block_tables=torch.tensor([[1, 2], [3, 4], [5, 6]]),
        hidden=torch.ones(3, size),
    )
    padded = padded_batch_size(inputs.num_seqs, graphs.batch_sizes)
    with torch.inference_mode():
        assert graphs.run_proposal(inputs, padded).shape == (3, 3) and padded == 4
    b = {name: t[:4].tolist() for name, t in graphs.proposal_buffers.static.items()}
    assert b["tokens"] == [5, 6, 7, 0] and b["starts"] == [10, 20, 30, 0]
    assert b["num_drafts"] == [3, 1, 2, 0]  # the padded row wants no drafts: no KV, no attention
    assert b["block_tables"] == [[1, 2, 0], [3, 4, 0], [5, 6, 0], [0, 0, 0]]
    assert b["hidden"] == [[1.0] * size] * 3 + [[0.0] * size]


def test_token_sizes_hold_every_uniform_batch_and_the_mixed_steps_up_to_the_cap():
    """Batch b of q-token rows pads to exactly b * q tokens; mixed steps up to MAX_MIXED_TOKENS find a
    graph; nothing beyond the step budget is captured."""
    sizes = graph_token_sizes([1, 2, 4, 8], (1, 5), 2048)
    assert {1, 2, 4, 8, 5, 10, 20, 40} <= set(sizes)
    assert max(sizes) == MAX_MIXED_TOKENS
    for num_tokens in range(1, MAX_MIXED_TOKENS + 1):
        assert padded_batch_size(num_tokens, sizes) is not None, num_tokens
    assert padded_batch_size(MAX_MIXED_TOKENS + 1, sizes) is None  # a long prefill runs eagerly


def test_a_small_step_budget_caps_the_token_sizes_and_is_itself_a_size():
    sizes = graph_token_sizes([1, 2, 4], (1, 5), 13)
    assert sizes == [1, 2, 4, 5, 10, 13]
    assert all(padded_batch_size(n, sizes) is not None for n in range(1, 14))
