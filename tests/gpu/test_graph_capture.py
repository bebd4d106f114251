"""Capturing CUDA graphs while an earlier engine's graphs wait for the garbage collector.

A graph destroyed while a stream captures invalidates that capture. The oracle's workers build engine
after engine in one process; the last engine's graphs sit in reference cycles, and the collector freed
them in the middle of a drafter's capture (CUDA error: operation failed due to a previous error during
capture). `GraphPool.capturing` collects before it captures.

Run on a GPU machine with `pytest -m gpu tests/gpu`; skipped elsewhere.
"""

import gc
import weakref

import pytest
import torch

from refengine.model.graphs import GraphPool

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class _Cycle:
    """Holds a graph in a reference cycle: only the collector frees it."""

    def __init__(self, graph: torch.cuda.CUDAGraph) -> None:
        self.graph = graph
        self.me = self


def test_a_collection_inside_a_capture_finds_no_graph_to_destroy():
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    was_enabled = gc.isenabled()
    gc.disable()  # only the collections below run, where the test puts them
    try:
        pool = GraphPool("cuda")
        with pool.capturing():
            old, _ = pool.capture(lambda: x * 2, persist=False)
        left = weakref.ref(_Cycle(old))
        del old
        assert left() is not None  # garbage now, but not yet collected

        def step_that_collects() -> torch.Tensor:
            if torch.cuda.is_current_stream_capturing():  # not in the warm-up calls before it
                gc.collect()  # what an allocation anywhere in a captured step may trigger
            return x + 1

        engine = GraphPool("cuda")  # the next engine's pool (the oracle's workers build engine after engine)
        with engine.capturing():
            graph, out = engine.capture(step_that_collects, persist=True)  # out lives outside the pool
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, x + 1)
        assert left() is None  # the earlier graph was collected, before the capture began
    finally:
        if was_enabled:
            gc.enable()
