"""The CUDA graphs' staging layout on the CPU (worker/graph_layout.py): what a GPU replays for a step
that mixes a prefill chunk with decode and verify rows. The attention over the padded layout runs in
tests/model/triton_attention_cases.py."""

import numpy as np
import pytest
import torch

from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.worker.device_inputs import DeviceInputIndices
from refengine.worker.errors import RunnerInvariantError
from refengine.worker.graph_layout import GraphLayout

LAYOUT = GraphLayout(max_tokens=32, max_seqs=4, max_logits=20, width=6)


def mixed_step():
    # a decode row, a verify block of 4 drafts, a prefill chunk of 6 that reaches its last token
    meta = build_attention_metadata([7, 20, 0], [1, 5, 6], [[3, 4], [5, 6, 7], [8, 9]], 16, causal=True)
    ids = torch.arange(100, 112)
    positions = torch.arange(12) + 1000
    sampled = torch.tensor([0, 1, 2, 3, 4, 5, 11])
    return ids, positions, meta, sampled


def host_indices(meta, at=(), take=(), sources=None, host_shift=None):
    """The step's device-completion indices: by default no row reads the device and nothing moves."""
    n = meta.seq_lens.shape[0]
    seq_of_token = np.repeat(np.arange(n), np.diff(meta.query_start_loc.numpy()))
    return DeviceInputIndices.build(list(at), list(take), sources or [-1] * n, host_shift or [0] * n, seq_of_token)


def test_a_mixed_step_keeps_its_rows_first_and_pads_behind_them():
    ids, positions, meta, sampled = mixed_step()
    buffer = torch.full((LAYOUT.size,), 77, dtype=torch.int64)  # whatever an earlier step left
    LAYOUT.stage(buffer, 16, ids, positions, meta, sampled, host_indices(meta, at=[1], take=[3], sources=[-1, 0, -1], host_shift=[0, 2, 0]))
    v = LAYOUT.views(buffer, 16)
    assert v.ids.tolist() == list(range(100, 112)) + [0] * 4
    assert v.positions.tolist()[:12] == list(range(1000, 1012)) and v.positions.tolist()[12:] == [0] * 4
    assert v.slots.tolist() == meta.slot_mapping.tolist() + [-1] * 4  # padding writes no KV
    # the step's sequences, then the padding sequence (tokens 12..15, no keys), then empty ones at T
    assert v.query_start_loc.tolist() == [0, 1, 6, 12, 16, 16]
    assert v.seq_lens.tolist() == [8, 25, 6, 0, 0]
    assert v.block_tables[:3, :3].tolist() == meta.block_tables.tolist()
    assert (v.block_tables[:3, 3:] == 0).all() and (v.block_tables[3:] == 0).all()
    assert v.logits_indices.tolist() == sampled.tolist() + [0] * 9  # min(16, 20) rows, sampled first
    assert v.metadata().slot_mapping.shape[0] == 16
    # the device completion's indices: padding rows read nothing and belong to the padding sequence (3),
    # which with the empty ones reads no frame row and moves by 0
    assert v.take.tolist() == [-1, 3] + [-1] * 14
    assert v.seq_of_token.tolist() == [0] + [1] * 5 + [2] * 6 + [3] * 4
    assert v.seq_source.tolist() == [-1, 0, -1, -1, -1] and v.seq_shift.tolist() == [0, 2, 0, 0, 0]


def test_pure_padding_is_one_sequence_without_keys():
    buffer = torch.full((LAYOUT.size,), 77, dtype=torch.int64)
    LAYOUT.stage(buffer, 8)
    v = LAYOUT.views(buffer, 8)
    assert v.query_start_loc.tolist() == [0, 8, 8, 8, 8, 8]
    assert v.seq_lens.tolist() == [0] * 5 and v.slots.tolist() == [-1] * 8
    assert v.ids.tolist() == [0] * 8 and v.logits_indices.tolist() == [0] * 8
    assert v.take.tolist() == [-1] * 8 and v.seq_of_token.tolist() == [0] * 8
    assert v.seq_source.tolist() == [-1] * 5 and v.seq_shift.tolist() == [0] * 5


@pytest.mark.parametrize("num_tokens", [8, 11])
def test_a_step_that_does_not_fit_its_graph_is_refused(num_tokens):
    ids, positions, meta, sampled = mixed_step()
    with pytest.raises(RunnerInvariantError, match="does not fit a graph"):
        LAYOUT.stage(torch.zeros(LAYOUT.size, dtype=torch.int64), num_tokens, ids, positions, meta, sampled, host_indices(meta))


def test_views_of_different_token_counts_share_one_buffer_without_overlap():
    buffer = torch.zeros(LAYOUT.size, dtype=torch.int64)
    v = LAYOUT.views(buffer, LAYOUT.max_tokens)
    fields = [v.ids, v.positions, v.slots, v.query_start_loc, v.seq_lens, v.logits_indices, v.block_tables]
    fields += [v.take, v.seq_of_token, v.seq_source, v.seq_shift]
    for i, field in enumerate(fields):
        field.fill_(i + 1)
    assert sorted(buffer.tolist()) == sorted(x for i, f in enumerate(fields) for x in [i + 1] * f.numel())
    assert buffer.numel() == sum(f.numel() for f in fields)


def step_of(num_seqs: int, tokens_each: int, width: int, num_sampled: int):
    meta = build_attention_metadata(
        [3] * num_seqs, [tokens_each] * num_seqs, [list(range(width))] * num_seqs, 16, causal=True
    )
    t = num_seqs * tokens_each
    return torch.arange(t), torch.arange(t), meta, torch.arange(num_sampled)


def test_a_step_that_fills_its_graph_exactly_is_staged():
    """As many tokens as the graph, max_seqs sequences, num_logits sampled rows and a full block-table row."""
    layout = GraphLayout(max_tokens=16, max_seqs=4, max_logits=12, width=3)
    ids, positions, meta, sampled = step_of(4, 4, 3, 12)
    buffer = torch.zeros(layout.size, dtype=torch.int64)
    layout.stage(buffer, 16, ids, positions, meta, sampled, host_indices(meta))
    v = layout.views(buffer, 16)
    assert v.query_start_loc.tolist() == [0, 4, 8, 12, 16, 16]  # no token left for the padding sequence
    assert v.logits_indices.tolist() == list(range(12))


@pytest.mark.parametrize(
    "num_seqs,tokens_each,width,num_sampled",
    [(5, 3, 3, 5), (4, 4, 3, 13), (4, 4, 4, 12)],
    ids=["one sequence too many", "one sampled row too many", "one block column too many"],
)
def test_a_step_one_over_any_limit_of_its_graph_is_refused(num_seqs, tokens_each, width, num_sampled):
    layout = GraphLayout(max_tokens=16, max_seqs=4, max_logits=12, width=3)
    ids, positions, meta, sampled = step_of(num_seqs, tokens_each, width, num_sampled)
    with pytest.raises(RunnerInvariantError, match="does not fit a graph"):
        layout.stage(torch.zeros(layout.size, dtype=torch.int64), 16, ids, positions, meta, sampled, host_indices(meta))


def test_the_graphs_metadata_is_its_views_and_causal():
    v = LAYOUT.views(torch.zeros(LAYOUT.size, dtype=torch.int64), 16)
    meta = v.metadata()
    fields = (meta.query_start_loc, meta.seq_lens, meta.block_tables, meta.slot_mapping)
    assert all(a is b for a, b in zip(fields, (v.query_start_loc, v.seq_lens, v.block_tables, v.slots), strict=True))
    assert meta.causal is True
