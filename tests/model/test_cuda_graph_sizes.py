"""The bucketing of batch sizes into captured CUDA graphs, on the CPU: what the target's and the
drafters' graph replays choose on a GPU. Every replay takes the smallest captured size that holds the
batch it has now: a batch that grows between steps never replays the smaller graph of an earlier step
(its static buffers would cut the new requests off), and one that shrinks gets the smaller graph."""

import pytest
import torch

from refengine.model.cuda_graph_sizes import (
    MAX_MIXED_TOKENS,
    default_batch_sizes,
    graph_token_sizes,
    padded_batch_size,
)
from refengine.spec_decode.draft_cuda_graphs import ProposalInputs


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


def test_a_proposal_padded_to_its_bucket_keeps_its_rows_and_pads_with_rows_that_want_no_drafts():
    inputs = ProposalInputs(
        tokens=torch.tensor([5, 6, 7]),
        starts=torch.tensor([10, 20, 30]),
        num_drafts=torch.tensor([3, 1, 2]),
        block_tables=torch.tensor([[1, 2], [3, 4], [5, 6]]),
        hidden=torch.ones(3, 2),
    )
    size = padded_batch_size(inputs.num_seqs, [1, 2, 4, 8])
    padded = inputs.padded(size, width=3)
    assert padded.num_seqs == size == 4
    assert padded.tokens.tolist() == [5, 6, 7, 0] and padded.starts.tolist() == [10, 20, 30, 0]
    assert padded.num_drafts.tolist() == [3, 1, 2, 0]  # the padded row wants no drafts: no KV, no attention
    assert padded.block_tables.tolist() == [[1, 2, 0], [3, 4, 0], [5, 6, 0], [0, 0, 0]]
    assert padded.hidden.tolist() == [[1, 1], [1, 1], [1, 1], [0, 0]]


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
