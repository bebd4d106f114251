"""The CUDA-graph runtime, the one place graphs are captured and replayed (docs/design/cuda-graphs.md).

- sizes: the padded batch (or token count) a step replays, chosen afresh for every step;
- BufferSet: a kind of step's static inputs, declared once as fields with their pad values; host values
  travel in one pinned staging copy, device values by device-to-device copies;
- GraphSet: a step function captured per key into the engine's one GraphPool and replayed, or run
  eagerly on the same buffers where no graph was captured (the CPU, an uncaptured key, the tests);
- GraphStats: what was captured and replayed, read-only, for the profiler.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from refengine.model.device import on_device

# The longest step the target's graphs hold: an admitted request's prefill beside the others' decodes.
# Longer steps spend their time in compute, not in launches, and run eagerly (vLLM caps its sizes too).
MAX_MIXED_TOKENS = 512
MIXED_TOKEN_STEP = 128


def default_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 below max_num_seqs, and max_num_seqs itself."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    sizes += list(range(16, max_num_seqs, 8))
    return sorted(set(sizes + [max_num_seqs]))


def padded_batch_size(num_seqs: int, captured: Iterable[int]) -> int | None:
    """The smallest captured size of at least `num_seqs` rows, None when none holds them (eager). A size
    kept from an earlier, smaller batch would cut the extra rows off: it is chosen afresh each step."""
    return min((b for b in captured if b >= num_seqs), default=None)


def graph_token_sizes(batch_sizes: Iterable[int], query_lens: Iterable[int], max_num_batched_tokens: int) -> list[int]:
    """The target's token counts: every batch size times every query length (uniform decode and verify
    steps pad no further than to their batch), every MIXED_TOKEN_STEP up to MAX_MIXED_TOKENS for mixed
    steps, and the step budget itself when it is below that; none above the budget."""
    lens = list(query_lens)
    sizes = {b * q for b in batch_sizes for q in lens}
    sizes |= set(range(MIXED_TOKEN_STEP, MAX_MIXED_TOKENS + 1, MIXED_TOKEN_STEP))
    sizes.add(min(max_num_batched_tokens, MAX_MIXED_TOKENS))
    return sorted(t for t in sizes if t <= max_num_batched_tokens)


@dataclass(frozen=True, slots=True)
class Field:
    shape: tuple[int, ...]  # the largest extent, rows first
    pad: float = 0  # what a padding row holds
    dtype: torch.dtype = torch.int64
    staged: bool = True  # host values go through the staging copy; False: device values only


class BufferSet:
    """Static inputs of one kind of step. The staged fields share one byte buffer, pinned on the host
    and copied to the device in one non-blocking copy (on the CPU the host buffer is the buffer)."""

    def __init__(self, device: torch.device, fields: dict[str, Field]) -> None:
        self.fields = fields
        self.on_gpu = device.type == "cuda"
        sizes = {name: -(-int(np.prod(f.shape)) * f.dtype.itemsize // 8) * 8 for name, f in fields.items() if f.staged}
        host = torch.zeros(max(sum(sizes.values()), 8), dtype=torch.uint8, pin_memory=self.on_gpu)
        self._buffers = (host, torch.zeros_like(host, device=device) if self.on_gpu else host)
        self.static: dict[str, torch.Tensor] = {}
        self._host: dict[str, np.ndarray] = {}
        offset = 0
        for name, f in fields.items():
            if not f.staged:
                self.static[name] = torch.full(f.shape, f.pad, dtype=f.dtype, device=device)
                continue
            view = slice(offset, offset + int(np.prod(f.shape)) * f.dtype.itemsize)
            self.static[name] = self._buffers[1][view].view(f.dtype).view(f.shape)
            self._host[name] = host[view].view(f.dtype).view(f.shape).numpy()
            self._host[name][:] = f.pad
            offset += sizes[name]
        # Set when the last staging copy has left the host buffer: the next step's writes wait for it.
        self.copied = torch.cuda.Event() if self.on_gpu else None
        self._after_send: list[Callable[[], Any]] = []

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.static[name]

    def begin(self) -> None:
        """Wait until the previous step's staging copy has left the host buffer."""
        if self.copied is not None:
            self.copied.synchronize()

    def put(self, name: str, value: Any, upto: int, pad: float | None = None) -> None:
        """Rows [:len(value)] of a field from `value` (host or device), rows up to `upto` its pad; a
        narrower 2-d value pads its other columns too."""
        f, n = self.fields[name], len(value)
        pad = f.pad if pad is None else pad
        head = np.s_[:n] if len(f.shape) == 1 else np.s_[:n, : value.shape[1]]
        tail = None if len(f.shape) == 1 else np.s_[:n, value.shape[1] :]
        if f.staged:  # the padding, and host values, travel in the staging copy
            rows = self._host[name]
            rows[n:upto] = pad
            if tail is not None:
                rows[tail] = pad
            if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                self._after_send.append(partial(self.static[name][head].copy_, value))  # after the copy
            else:
                rows[head] = value.numpy() if isinstance(value, torch.Tensor) else value
            return
        static = self.static[name]
        static[head].copy_(value)
        if tail is not None:
            static[tail].fill_(pad)
        # An op on an empty slice still costs host time, and a full step has no padding.
        if upto > n:  # pragma: no mutate
            static[n:upto].fill_(pad)

    def send(self) -> None:
        """The staged fields to the device in one copy, then the device values of staged fields."""
        if self.on_gpu:  # pragma: no mutate
            self._buffers[1].copy_(self._buffers[0], non_blocking=True)
            self.copied.record()
        for copy in self._after_send:
            copy()
        self._after_send.clear()


class GraphPool:
    """The engine's one CUDA-graph memory pool: every graph set captures into it (as vLLM's global pool)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._handle = None

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        # A graph destroyed while a stream captures invalidates that capture. A process that builds engine
        # after engine (the oracle's workers) leaves the last engine's graphs in reference cycles, which
        # the collector frees at whatever allocation triggers it, mid-capture too: collect them first.
        gc.collect()
        with torch.inference_mode(), on_device(self.device):
            if self._handle is None:
                self._handle = torch.cuda.graph_pool_handle()
            yield
        torch.cuda.synchronize(self.device)

    def capture(self, fn: Callable[[], _Out]) -> tuple[torch.cuda.CUDAGraph, _Out]:
        """Run `fn` twice on a side stream (compiling kernels, creating handles), then record one call
        into the pool; inside `capturing()`."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._handle):
            out = fn()
        return graph, out


_Key = TypeVar("_Key", bound=Hashable)
_Out = TypeVar("_Out")


@dataclass(frozen=True, slots=True)
class GraphStats:
    name: str
    keys: tuple  # the captured keys
    num_replays: int
    num_eager_steps: int


class GraphSet(Generic[_Key, _Out]):
    """A step function of its static buffers, per key: replayed where captured, else run eagerly."""

    def __init__(self, name: str, step: Callable[[_Key], _Out]) -> None:
        self.name = name
        self.step = step
        self._graphs: dict[_Key, tuple[torch.cuda.CUDAGraph, _Out]] = {}
        self.num_replays = 0
        self.num_eager_steps = 0

    def capture(self, pool: GraphPool, keys: Iterable[_Key], prepare: Callable[[_Key], Any] | None = None) -> None:
        """One graph per key, `prepare(key)` (pure padding in the buffers) before each."""
        with pool.capturing():
            for key in keys:
                if prepare is not None:
                    prepare(key)
                self._graphs[key] = pool.capture(partial(self.step, key))

    def holds(self, key: _Key) -> bool:
        return key in self._graphs

    def output(self, key: _Key) -> _Out:
        """The static output of the graph of `key`: current after each of its replays."""
        return self._graphs[key][1]

    def run(self, key: _Key) -> _Out:
        captured = self._graphs.get(key)
        if captured is None:
            self.num_eager_steps += 1
            return self.step(key)
        captured[0].replay()
        self.num_replays += 1
        return captured[1]

    @property
    def stats(self) -> GraphStats:
        return GraphStats(self.name, tuple(self._graphs), self.num_replays, self.num_eager_steps)
