"""Capturing CUDA graphs: the one warm-up-then-capture loop that the target's graphs
(worker/cuda_graphs.py), the rejection sampler's (worker/sampler_graphs.py) and the drafters'
(spec_decode/draft_cuda_graphs.py, spec_decode/draft_step_graphs.py) share. A GPU only.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

from refengine.model.device import on_device

_Out = TypeVar("_Out")
Capture = Callable[[Callable[[], _Out]], tuple[torch.cuda.CUDAGraph, _Out]]


@contextlib.contextmanager
def graph_capture(device: torch.device | str) -> Iterator[Capture]:
    """A block that captures graphs on `device` into one memory pool: it yields `capture(fn)`, which
    runs `fn` twice on a side stream (compiling kernels, creating handles) and then records one call of
    it, returning the graph and the call's static output."""
    # A CUDA graph destroyed while a stream captures invalidates that capture ("operation not permitted
    # when stream is capturing"). A process that builds engine after engine (the oracle's workers) leaves
    # the last engine's graphs in reference cycles, and the collector frees those at whatever allocation
    # triggers it, mid-capture too. Collect them before the first capture; nothing captured in this block
    # becomes garbage during it.
    gc.collect()
    pool = torch.cuda.graph_pool_handle()

    def capture(fn: Callable[[], _Out]) -> tuple[torch.cuda.CUDAGraph, _Out]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # compile kernels, create handles
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
        return graph, out

    # New streams and the capture use the thread's current device: make it the graphs' device.
    with torch.inference_mode(), on_device(device):
        yield capture
    torch.cuda.synchronize(device)
