"""The target's CUDA-graph buffers on the CPU (worker/target_graphs.py): what a GPU replays for a step
that mixes a prefill chunk with decode and verify rows. The attention over the padded layout runs in
tests/model/triton_attention_cases.py."""

import numpy as np
import pytest
import torch

from refengine.model import KVCache
from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.model.static_buffers import BufferSet, Field
from refengine.worker.device_inputs import DeviceInputIndices
from refengine.worker.errors import RunnerInvariantError
from refengine.worker.target_graphs import TargetGraphs


def graphs(tiny4, max_tokens=32, max_seqs=4, max_logits=20, width=6) -> TargetGraphs:
    cache = KVCache.allocate(tiny4.config, 4, 16)
    g = TargetGraphs(tiny4.model, cache, [max_tokens], [max_seqs], max_num_seqs=max_seqs, max_logits=max_logits, max_blocks_per_seq=width)
    for t in g.buffers.static.values():
        t.fill_(77)  # whatever an earlier step left
    return g


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


def test_a_mixed_step_keeps_its_rows_first_and_pads_behind_them(tiny4):
    ids, positions, meta, sampled = mixed_step()
    g = graphs(tiny4)
    g.stage(16, ids, positions, meta, sampled, host_indices(meta, at=[1], take=[3], sources=[-1, 0, -1], host_shift=[0, 2, 0]))
    v = {name: t.tolist() for name, t in g.buffers.static.items()}
    assert v["ids"][:16] == list(range(100, 112)) + [0] * 4
    assert v["positions"][:12] == list(range(1000, 1012)) and v["positions"][12:16] == [0] * 4
    assert v["slots"][:16] == meta.slot_mapping.tolist() + [-1] * 4  # padding writes no KV
    # the step's sequences, then the padding sequence (tokens 12..15, no keys), then empty ones at T
    assert v["query_start_loc"] == [0, 1, 6, 12, 16, 16]
    assert v["seq_lens"] == [8, 25, 6, 0, 0]
    tables = g.buffers["block_tables"]
    assert tables[:3, :3].tolist() == meta.block_tables.tolist()
    assert (tables[:3, 3:] == 0).all() and (tables[3:] == 0).all()
    assert v["logits_indices"][:16] == sampled.tolist() + [0] * 9  # min(16, 20) rows, sampled first
    # the device completion's indices: padding rows read nothing and belong to the padding sequence (3),
    # which with the empty ones reads no frame row and moves by 0
    assert v["take"][:16] == [-1, 3] + [-1] * 14
    assert v["seq_of_token"][:16] == [0] + [1] * 5 + [2] * 6 + [3] * 4
    assert v["seq_source"] == [-1, 0, -1, -1, -1] and v["seq_shift"] == [0, 2, 0, 0, 0]


def test_pure_padding_is_one_sequence_without_keys(tiny4):
    g = graphs(tiny4)
    g.stage(8)
    v = {name: t.tolist() for name, t in g.buffers.static.items()}
    assert v["query_start_loc"] == [0, 8, 8, 8, 8, 8]
    assert v["seq_lens"] == [0] * 5 and v["slots"][:8] == [-1] * 8
    assert v["ids"][:8] == [0] * 8 and v["logits_indices"][:8] == [0] * 8
    assert v["take"][:8] == [-1] * 8 and v["seq_of_token"][:8] == [0] * 8
    assert v["seq_source"] == [-1] * 5 and v["seq_shift"] == [0] * 5


@pytest.mark.parametrize("num_tokens", [8, 11])
def test_a_step_that_does_not_fit_its_graph_is_refused(tiny4, num_tokens):
    ids, positions, meta, sampled = mixed_step()
    with pytest.raises(RunnerInvariantError, match="does not fit a graph"):
        graphs(tiny4).stage(num_tokens, ids, positions, meta, sampled, host_indices(meta))


def test_the_staged_fields_share_one_buffer_without_overlap():
    fields = {"a": Field((5,)), "b": Field((3, 2), pad=-1), "c": Field((4,), 1, torch.float32), "d": Field((2,), staged=False)}
    buffers = BufferSet(torch.device("cpu"), fields)
    assert buffers["b"].tolist() == [[-1, -1]] * 3 and buffers["c"].tolist() == [1.0] * 4  # each starts as padding
    for i, name in enumerate(fields):
        buffers[name].fill_(i + 2)
    assert [buffers[name].unique().tolist() for name in fields] == [[2], [3], [4.0], [5]]


def step_of(num_seqs: int, tokens_each: int, width: int, num_sampled: int):
    meta = build_attention_metadata(
        [3] * num_seqs, [tokens_each] * num_seqs, [list(range(width))] * num_seqs, 16, causal=True
    )
    t = num_seqs * tokens_each
    return torch.arange(t), torch.arange(t), meta, torch.arange(num_sampled)


def test_a_step_that_fills_its_graph_exactly_is_staged(tiny4):
    """As many tokens as the graph, max_seqs sequences, num_logits sampled rows and a full block-table row."""
    g = graphs(tiny4, max_tokens=16, max_seqs=4, max_logits=12, width=3)
    ids, positions, meta, sampled = step_of(4, 4, 3, 12)
    g.stage(16, ids, positions, meta, sampled, host_indices(meta))
    assert g.buffers["query_start_loc"].tolist() == [0, 4, 8, 12, 16, 16]  # no token left for the padding sequence
    assert g.buffers["logits_indices"].tolist() == list(range(12))


@pytest.mark.parametrize(
    "num_seqs,tokens_each,width,num_sampled",
    [(5, 3, 3, 5), (4, 4, 3, 13), (4, 4, 4, 12)],
    ids=["one sequence too many", "one sampled row too many", "one block column too many"],
)
def test_a_step_one_over_any_limit_of_its_graph_is_refused(tiny4, num_seqs, tokens_each, width, num_sampled):
    g = graphs(tiny4, max_tokens=16, max_seqs=4, max_logits=12, width=3)
    ids, positions, meta, sampled = step_of(num_seqs, tokens_each, width, num_sampled)
    with pytest.raises(RunnerInvariantError, match="does not fit a graph"):
        g.stage(16, ids, positions, meta, sampled, host_indices(meta))
