"""`arrays_to_device` cases: on the CPU in test_device.py, on a GPU in tests/gpu (star-imported there)."""

import numpy as np
import pytest
import torch

from refengine.model.device import arrays_to_device

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("first_len", [0, 1, 3, 8])
def test_packed_arrays_come_back_whole_in_their_dtypes_and_shapes(first_len):
    # An odd-sized first array moves the others off 8-byte boundaries unless each is aligned.
    arrays = [
        np.arange(first_len, dtype=np.int32),
        np.array([1.5, -2.25, 3.0], dtype=np.float32),
        np.arange(12, dtype=np.int64).reshape(3, 4) - 5,
        np.zeros((0, 0), dtype=np.int32),
        np.array([True, False, True]),
        np.array([2.0**-40, 1e300]),
        np.arange(5, dtype=np.int64)[::2],  # not contiguous
    ]
    moved = arrays_to_device(arrays, DEVICE)
    assert len(moved) == len(arrays)
    for array, tensor in zip(arrays, moved, strict=True):
        assert tensor.device.type == DEVICE.type
        assert tuple(tensor.shape) == array.shape
        assert tensor.dtype == torch.from_numpy(np.ascontiguousarray(array)).dtype
        assert np.array_equal(tensor.cpu().numpy(), array)


def test_no_arrays_is_no_tensors():
    assert arrays_to_device([], DEVICE) == []
