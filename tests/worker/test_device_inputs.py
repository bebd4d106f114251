"""The device's completion of a step's inputs (worker/device_inputs.py), eagerly on the step's own tensors
and as a CUDA graph runs it, on the static buffers a larger graph pads (the same code, here on the CPU):
ids gathered from the latest frame, each sequence moved back by its host over-count and its rejected
drafts, its slots recomputed there; padding rows keep what they hold."""

import numpy as np
import torch

from refengine.model import KVCache
from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.worker.device_inputs import DeviceInputIndices
from refengine.worker.step_frame import StepFrame
from refengine.worker.target_graphs import TargetGraphs

BLOCK = 4
# The latest frame: two verified rows; its source holds their last tokens (31, 32), then their drafts
# (k = 2 each: 41, -1 | 43, 44); row 0 rejected 1 draft, row 1 none.
SOURCE = torch.tensor([31, 32, 41, -1, 43, 44])
REJECTED = torch.tensor([1, 0])
FRAME = StepFrame([], None, source=SOURCE, num_rejected=REJECTED, num_sampled=2, num_proposed=2)


def step():
    """Sequence 0 verifies 2 drafts in flight (3 rows from position 10, the host counting them all
    accepted) and was over-counted by 1 more on the host; sequence 1 decodes one row at position 6 whose
    id is in flight; sequence 2 is a prefill chunk of 2 rows, exact."""
    meta = build_attention_metadata([10, 6, 0], [3, 1, 2], [[0, 1, 2, 3], [4, 5], [6]], BLOCK, causal=True)
    ids = torch.tensor([0, 0, 0, 0, 7, 8])
    positions = torch.tensor([10, 11, 12, 6, 0, 1])
    seq_of_token = np.array([0, 0, 0, 1, 2, 2])
    # row 0 takes frame row 0's last token, rows 1-2 its drafts (entries 2, 3); row 3 frame row 1's last token
    indices = DeviceInputIndices.build([0, 1, 2, 3], [0, 2, 3, 1], [0, 1, -1], [1, 0, 0], seq_of_token)
    return ids, positions, meta, indices


def test_the_eager_completion_gathers_ids_and_moves_sequences_back_by_their_rejected_drafts():
    ids, positions, meta, indices = step()
    assert indices.gathers and indices.shifts
    done = indices.to_device(FRAME, torch.device("cpu")).complete(ids, positions, meta, BLOCK)
    # A draft the drafter did not propose (-1) is fed as 0 and handed on as -1, which verification rejects.
    assert done.ids.tolist() == [31, 41, 0, 32, 7, 8]
    assert done.gathered[:4].tolist() == [31, 41, -1, 32]
    # sequence 0 moves back by 1 (host) + 1 (rejected), sequence 1 by 0 + 0, the prefill chunk not at all
    assert done.positions.tolist() == [8, 9, 10, 6, 0, 1]
    assert done.attn_metadata.seq_lens.tolist() == [11, 7, 2]
    slots = [2 * BLOCK + 0, 2 * BLOCK + 1, 2 * BLOCK + 2, 5 * BLOCK + 2, 6 * BLOCK, 6 * BLOCK + 1]
    assert done.attn_metadata.slot_mapping.tolist() == slots
    # The host's inputs stay as it built them: a graph replaying its staged buffers redoes the same step.
    assert ids.tolist() == [0, 0, 0, 0, 7, 8] and positions.tolist() == [10, 11, 12, 6, 0, 1]
    assert meta.seq_lens.tolist() == [13, 7, 2]


def target_graphs(tiny4, max_tokens: int, max_seqs: int, max_logits: int, width: int, fill: int) -> TargetGraphs:
    cache = KVCache.allocate(tiny4.config, 8, BLOCK)
    g = TargetGraphs(tiny4.model, cache, [max_tokens], [max_seqs], max_num_seqs=max_seqs, max_logits=max_logits, max_blocks_per_seq=width)
    for t in g.buffers.static.values():
        t.fill_(fill)  # whatever an earlier step left
    return g


def completed(g: TargetGraphs, num_tokens: int):
    ids, positions, meta, _, inputs = g.static_inputs(num_tokens)
    return inputs.complete(ids, positions, meta, BLOCK)


def test_a_graphs_padded_buffers_complete_the_steps_rows_as_the_eager_path_and_leave_the_padding(tiny4):
    ids, positions, meta, indices = step()
    g = target_graphs(tiny4, 10, 4, 12, 6, fill=77)
    g.stage(10, ids, positions, meta, None, indices)
    # The graph's static copies of the frame: longer than the frame's, the last rejected entry 0.
    source, rejected = g.buffers["source"], g.buffers["rejected"]
    source[:], rejected[:] = 55, 9
    source[:6], rejected[:2], rejected[-1] = SOURCE, REJECTED, 0
    graph = completed(g, 10)
    again = completed(g, 10)

    eager = indices.to_device(FRAME, torch.device("cpu")).complete(ids, positions, meta, BLOCK)
    assert graph.ids[:6].tolist() == eager.ids.tolist() and graph.positions[:6].tolist() == eager.positions.tolist()
    assert graph.attn_metadata.slot_mapping[:6].tolist() == eager.attn_metadata.slot_mapping.tolist()
    assert graph.attn_metadata.seq_lens[:3].tolist() == eager.attn_metadata.seq_lens.tolist()
    assert graph.gathered[:4].tolist() == eager.gathered[:4].tolist()
    # the padding sequence (index 3, rows 6-9) and the empty one past it: no id, no move, no KV, no keys
    assert graph.ids[6:].tolist() == [0] * 4 and graph.positions[6:].tolist() == [0] * 4
    assert graph.attn_metadata.slot_mapping[6:].tolist() == [-1] * 4
    assert graph.attn_metadata.seq_lens[3:].tolist() == [0, 0]
    # A replay of the same staged buffers is the same step (a benchmark replays a graph alone, hundreds of times).
    assert torch.equal(again.positions, graph.positions) and torch.equal(again.attn_metadata.seq_lens, graph.attn_metadata.seq_lens)


def test_a_step_with_nothing_in_flight_reads_no_frame(tiny4):
    meta = build_attention_metadata([3], [2], [[0, 1]], BLOCK, causal=True)
    indices = DeviceInputIndices.build([], [], [-1], [0], np.array([0, 0]))
    assert not indices.gathers and not indices.shifts
    g = target_graphs(tiny4, 4, 2, 4, 2, fill=0)
    g.stage(4, torch.tensor([5, 6]), torch.tensor([3, 4]), meta, None, indices)
    # A graph completes every step: with stale frame values in its buffers, nothing moves.
    g.buffers["source"][:], g.buffers["rejected"][:] = 99, torch.tensor([7, 7, 0])
    done = completed(g, 4)
    assert done.ids.tolist() == [5, 6, 0, 0] and done.positions.tolist() == [3, 4, 0, 0]
    assert done.attn_metadata.slot_mapping.tolist() == meta.slot_mapping.tolist() + [-1, -1]
    assert done.attn_metadata.seq_lens[:1].tolist() == [5]

