"""The CUDA-graph runtime (docs/design/cuda-graphs.md): the sizes a step replays at, GraphSet (a step
function captured per key into the engine's one GraphPool, else run eagerly) and GraphStats."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

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
    """The target's token counts: every batch size times every query length, every MIXED_TOKEN_STEP up to
    MAX_MIXED_TOKENS for mixed steps, and the step budget when below that; none above the budget."""
    lens = list(query_lens)
    sizes = {b * q for b in batch_sizes for q in lens}
    sizes |= set(range(MIXED_TOKEN_STEP, MAX_MIXED_TOKENS + 1, MIXED_TOKEN_STEP))
    sizes.add(min(max_num_batched_tokens, MAX_MIXED_TOKENS))
    return sorted(t for t in sizes if t <= max_num_batched_tokens)


class GraphPool:
    """The engine's one CUDA-graph memory pool: every graph set captures into it (as vLLM's global pool)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._handle = None

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        # An earlier engine's graphs, left in reference cycles, must not be freed mid-capture (that
        # invalidates the capture): collect them first.
        gc.collect()
        with torch.inference_mode(), on_device(self.device):
            if self._handle is None:
                self._handle = torch.cuda.graph_pool_handle()
            yield
        torch.cuda.synchronize(self.device)

    def capture(self, fn: Callable[[], _Out], persist: bool) -> tuple[torch.cuda.CUDAGraph, _Out]:
        """Warm `fn` up twice on a side stream, then record it into the pool, inside `capturing()`. With
        `persist`, its outputs are copied into the warm-up's, outside the pool, where no other graph's
        scratch can overwrite them before they are read."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                kept = fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._handle):
            out = fn()
            if persist:
                for dst, src in zip(_tensors(kept), _tensors(out), strict=True):
                    if dst.data_ptr() != src.data_ptr():  # a view of a static input is already outside
                        dst.copy_(src)
        return graph, (kept if persist else out)


def _tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of a step's output (tensors, sequences, mappings and dataclasses of them), in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for item in out for t in _tensors(item)]
    if isinstance(out, dict):
        return [t for item in out.values() for t in _tensors(item)]
    if dataclasses.is_dataclass(out):
        return [t for f in dataclasses.fields(out) for t in _tensors(getattr(out, f.name))]
    return []


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

    def __init__(self, name: str, step: Callable[[_Key], _Out], *, persist: bool = True) -> None:
        self.name = name
        self.persist = persist
        self.step = step
        self._graphs: dict[_Key, tuple[torch.cuda.CUDAGraph, _Out]] = {}
        self.captured: tuple[_Key, ...] = ()  # kept once at capture: the dispatcher reads it every step
        self.num_replays = 0
        self.num_eager_steps = 0

    def capture(self, pool: GraphPool, keys: Iterable[_Key], prepare: Callable[[_Key], Any] | None = None) -> None:
        """One graph per key, `prepare(key)` (pure padding in the buffers) before each."""
        with pool.capturing():
            for key in keys:
                if prepare is not None:
                    prepare(key)
                self._graphs[key] = pool.capture(partial(self.step, key), self.persist)
        self.captured = tuple(self._graphs)

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
        return GraphStats(self.name, self.captured, self.num_replays, self.num_eager_steps)
