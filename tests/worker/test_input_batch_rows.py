"""The persistent batch's rows on their own (refengine/worker/input_batch.py, block_table.py), without a
model: the exact work each membership change and step write costs (the counters the engine-level test
in test_input_batch.py compares step to step), the -1 padding of unused block-table entries, and the
named errors for a full batch and a request with more blocks than its row holds."""

import numpy as np
import pytest
import torch

from refengine.core.outputs import NewRequestData
from refengine.sampling_params import SamplingParams
from refengine.worker.errors import RunnerInvariantError
from refengine.worker.input_batch import InputBatch
from refengine.worker.request_state import CachedRequestState

MAX_BLOCKS = 3


def state(req_id: str, prompt: tuple[int, ...], blocks: tuple[int, ...]) -> CachedRequestState:
    sp = SamplingParams(temperature=0.0, max_tokens=4)
    return CachedRequestState.from_new(NewRequestData(req_id, prompt, (), sp, 7, None, blocks, 0))


def add(b: InputBatch, req_id: str, prompt: tuple[int, ...], blocks: tuple[int, ...]) -> int:
    return b.add_request(state(req_id, prompt, blocks), prompt)


def batch() -> InputBatch:
    return InputBatch(max_num_reqs=2, max_model_len=12, max_num_blocks_per_req=MAX_BLOCKS, block_size=4)


def counters(b: InputBatch) -> tuple[int, int, int]:
    return b.num_token_writes, b.block_table.num_writes, b.num_row_writes


def test_each_change_costs_exactly_its_own_writes():
    b = batch()
    assert counters(b) == (0, 0, 0)
    add(b, "a", (5, 6, 7), (4,))
    add(b, "b", (8, 9), (2, 5))
    assert counters(b) == (5, 3, 2)  # both prompts, both requests' blocks, two rows
    b.write_tokens(0, 3, [11])
    b.write_tokens(0, 4, [12, 13])
    b.block_table.extend(0, (4, 9))  # one block added to a's one
    b.block_table.extend(1, (2, 5))  # b's blocks as held: nothing to write
    assert counters(b) == (8, 4, 2)
    b.remove_request("a")  # b moves into row 0: one row written whole, no token or block entries
    assert counters(b) == (8, 4, 3)
    assert b.req_ids == ["b"] and b.token_ids[0, :2].tolist() == [8, 9]


def test_unused_block_entries_hold_minus_one_also_in_a_reused_row():
    # -1 is the padding the attention ops read as "no block"; any other value would alias a real block.
    b = batch()
    assert (b.block_table.table == -1).all()
    add(b, "a", (5, 6, 7, 8, 9), (6, 7))
    b.remove_request("a")
    add(b, "c", (5,), (3,))  # row 0 again, after a held two blocks there
    assert b.block_table.table[0].tolist() == [3, -1, -1]
    assert b.block_table.num_blocks[0] == 1


def test_a_request_past_the_batch_rows_is_refused_by_name():
    b = batch()
    add(b, "a", (5,), (1,))
    add(b, "b", (6,), (2,))
    with pytest.raises(RunnerInvariantError, match=r"^request 'c': the batch holds its 2 rows$"):
        add(b, "c", (7,), (3,))
    assert b.req_ids == ["a", "b"]


def test_more_blocks_than_a_row_holds_are_refused_by_name():
    b = batch()
    add(b, "a", (5,), (1,))
    with pytest.raises(RunnerInvariantError, match=r"^row 0: 4 blocks exceed the 3 per request$"):
        b.block_table.extend(0, (1, 2, 3, 4))
    assert np.array_equal(b.block_table.table[0], [1, -1, -1])


def test_the_sampler_gets_its_row_parameters_as_float32():
    # The sampler's arithmetic is float32 on every device; a float64 column would promote the logits it
    # scales (and double the host-to-device copy).
    b = batch()
    add(b, "a", (5,), (1,))
    meta = b.sampling_metadata([0], [1], [], torch.device("cpu"))
    assert meta.temperature.dtype == meta.top_p.dtype == torch.float32
