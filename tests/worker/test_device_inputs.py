"""DeviceInputs.apply on a CUDA graph's static buffers: the step's tokens are their first rows, and only
those move back; the padding rows past them keep what they held."""

import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.worker.device_inputs import DeviceInputs


def test_apply_moves_back_only_the_steps_rows_of_padded_buffers():
    # Two sequences (2 tokens and 1) in buffers padded to 5 rows and 3 sequences; the host over-counted
    # them by 2 and 1 positions. Blocks of 4: sequence 0 holds blocks 0-3, sequence 1 blocks 4-7.
    ids = torch.tensor([5, 6, 7, 0, 0])
    positions = torch.tensor([10, 11, 7, 0, 0])
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, 2, 3, 3]),
        seq_lens=torch.tensor([12, 8, 0]),
        block_tables=torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [-1, -1, -1, -1]]),
        slot_mapping=torch.tensor([40, 41, 30, -1, -1]),
    )
    inputs = DeviceInputs(
        torch.tensor([], dtype=torch.int64),
        torch.tensor([], dtype=torch.int64),
        shift=torch.tensor([2, 1]),
        seq_of_token=torch.tensor([0, 0, 1]),
    )
    inputs.apply(ids, positions, meta, block_size=4)
    assert positions.tolist() == [8, 9, 6, 0, 0]
    assert meta.seq_lens.tolist() == [10, 7, 0]
    assert meta.slot_mapping.tolist() == [2 * 4 + 0, 2 * 4 + 1, 5 * 4 + 2, -1, -1]
    assert ids.tolist() == [5, 6, 7, 0, 0]  # no id came from the device
