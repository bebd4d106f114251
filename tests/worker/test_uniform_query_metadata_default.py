"""uniform_query_metadata's default is causal attention: the EAGLE/MTP passes call it without the flag
(one query row each, where either mode attends alike), so only its own default guards a caller of
several query rows that leaves the flag out (tests/spec_decode/test_fixed_shape_proposals.py checks the
tensors with the flag given)."""

import torch

from refengine.model.attention_metadata_builder import uniform_query_metadata


def test_metadata_is_causal_unless_asked_otherwise():
    tables = torch.tensor([[0, 1], [2, 3]])
    meta, positions = uniform_query_metadata(torch.tensor([1, 4]), torch.tensor([3, 3]), tables, 4, num_query=3)
    assert meta.causal is True
    assert positions.tolist() == [1, 2, 3, 4, 5, 6]
