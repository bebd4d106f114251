"""Persistent buffers: a kind of step's static inputs, declared once as fields with their pad values,
which a CUDA graph (graphs.py) replays at fixed addresses and the eager way fills alike. Host values
travel in one pinned staging copy, device values by device-to-device copies."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch


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
