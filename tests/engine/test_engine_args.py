"""EngineArgs that cannot make an engine are refused by name before anything is allocated."""

import pytest

from refengine.engine.arg_utils import EngineArgs
from refengine.engine.engine_args import build_engine
from refengine.model.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model("qwen3", seed=1)


@pytest.mark.parametrize("sizes", [(), (0, 2), (2, 9)])
def test_cuda_graph_sizes_outside_the_batch_limit_are_refused(tiny, sizes):
    with pytest.raises(ValueError, match=r"cuda_graph_sizes must be batch sizes in 1\.\.max_num_seqs=8"):
        build_engine(EngineArgs(model=tiny, num_blocks=16, max_model_len=64, max_num_seqs=8, cuda_graph_sizes=sizes))
