"""The bucketing of batch sizes into captured CUDA graphs, on the CPU: what the target's and the
drafters' graph replays choose on a GPU. Every replay takes the smallest captured size that holds the
batch it has now: a batch that grows between steps never replays the smaller graph of an earlier step
(its static buffers would cut the new requests off), and one that shrinks gets the smaller graph."""

import pytest
import torch

from refengine.model.cuda_graph_sizes import default_batch_sizes, padded_batch_size
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
