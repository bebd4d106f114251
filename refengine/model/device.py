"""Moving built objects to a device: modules with their parameters, and the paged KV caches they hold.

Drafters are built on the CPU (their heads initialise from a CPU generator); `move_to_device` then
carries a drafter, its head modules and the KV caches those keep as plain attributes to the target's
device, without the drafter code knowing about devices.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch
from torch import nn

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.kv_cache import KVCache

_Moved = TypeVar("_Moved", torch.Tensor, AttentionMetadata)


def to_device(value: _Moved, device: torch.device) -> _Moved:
    """A host tensor (or metadata) on `device`: to a GPU from pinned memory, without waiting for it (a
    pageable copy would hold the host until the device caught up). The one host-to-device copy of the
    runner, the sampler and the drafters."""
    if device.type != "cuda" or (isinstance(value, torch.Tensor) and value.device.type == "cuda"):
        return value  # on the host for the host, or already on the device
    # Runs only on a GPU: CPU mutation testing cannot reach it (pytest -m gpu checks it).
    return value.pin_memory().to(device, non_blocking=True)  # pragma: no mutate


# The dtypes the runner's host arrays have, as torch names them.
_TORCH_DTYPES = {
    np.dtype(np.int64): torch.int64,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.bool_): torch.bool,
}
# Each array starts at a multiple of this many bytes in the packed buffer, so a slice of it can be
# viewed as any of those dtypes.
_ALIGN = 8


def arrays_to_device(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Host arrays on `device` in one host-to-device copy: packed end to end into one byte buffer, each
    at an aligned offset, moved by `to_device`, then cut back into views of their dtypes and shapes.
    Every copy costs the host a pinned allocation and a launch, which a step's small arrays repeated."""
    offsets: list[int] = []
    size = 0
    for array in arrays:
        offsets.append(size)
        size += -(-array.nbytes // _ALIGN) * _ALIGN
    # Never empty: torch cannot view a zero-length byte buffer as a wider dtype.
    packed = np.empty(max(size, _ALIGN), dtype=np.uint8)
    for array, offset in zip(arrays, offsets, strict=True):
        packed[offset : offset + array.nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    moved = to_device(torch.from_numpy(packed), device)
    return [
        moved[offset : offset + array.nbytes].view(_TORCH_DTYPES[array.dtype]).view(array.shape)
        for array, offset in zip(arrays, offsets, strict=True)
    ]


def on_device(device: torch.device | str) -> contextlib.AbstractContextManager:
    """Make `device` the current CUDA device for a block (a no-op for CPU tensors). Triton kernels,
    new streams, events and graph captures use the thread's current device, not their tensors': an
    engine on cuda:1 must launch there, without a process-wide `set_device` that would move others."""
    device = torch.device(device)
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def move_to_device(obj: object, device: torch.device | str, *, _depth: int = 0, _seen: set[int] | None = None) -> None:
    """Move every nn.Module reachable from `obj` through attributes (a few levels deep), and replace
    every KVCache attribute on the way with a copy on `device`."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen or _depth > 4:
        return
    seen.add(id(obj))
    if isinstance(obj, nn.Module):
        obj.to(device)
        holders: list[object] = list(obj.modules())
    else:
        holders = [obj]
    for holder in holders:
        seen.add(id(holder))
        attrs = _attributes(holder)
        for name, value in attrs.items():
            if isinstance(value, KVCache):
                if value.layers and value.device != torch.device(device):
                    _set(holder, name, value.to(device))
            elif isinstance(value, nn.Module | list | tuple) or _is_plain(value):
                for item in value if isinstance(value, list | tuple) else (value,):
                    if isinstance(item, nn.Module) or _is_plain(item):
                        move_to_device(item, device, _depth=_depth + 1, _seen=seen)


def _attributes(obj: object) -> dict[str, object]:
    attrs = dict(getattr(obj, "__dict__", {}))
    for name in getattr(type(obj), "__slots__", ()):
        if hasattr(obj, name):
            attrs[name] = getattr(obj, name)
    if isinstance(obj, nn.Module):
        attrs = {k: v for k, v in attrs.items() if not k.startswith("_")}
    return attrs


def _is_plain(value: object) -> bool:
    """An object of the project's own classes (drafters, views), not builtins or tensors."""
    module = type(value).__module__
    return module.startswith("refengine.") and not isinstance(value, torch.Tensor)


def _set(holder: object, name: str, value: object) -> None:
    if dataclasses.is_dataclass(holder) and type(holder).__dataclass_params__.frozen:
        object.__setattr__(holder, name, value)
    else:
        setattr(holder, name, value)
