"""Typed access to a GGUF file's metadata and dequantized tensors."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from refengine.model.errors import ModelLoadError

_T = gguf.GGMLQuantizationType
SUPPORTED_TYPES = frozenset({_T.F32, _T.F16, _T.BF16, _T.Q8_0, _T.Q4_0, _T.Q4_1, _T.Q4_K, _T.Q6_K})


class GgufFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._reader = gguf.GGUFReader(path)
        except Exception as err:  # the reader raises whatever its parsing hits on a bad file
            raise ModelLoadError(f"{path}: not a readable GGUF file ({type(err).__name__}: {err})") from err
        self._tensors = {tensor.name: tensor for tensor in self._reader.tensors}

    def has(self, key: str) -> bool:
        return key in self._reader.fields

    def _value(self, key: str, kinds: tuple[type, ...]) -> object:
        field = self._reader.fields.get(key)
        if field is None:
            raise ModelLoadError(f"{self.path}: missing metadata key {key!r}")
        try:
            value = field.contents()
        except Exception as err:
            raise ModelLoadError(f"{self.path}: metadata key {key!r} cannot be read ({err})") from err
        if not isinstance(value, kinds):
            raise ModelLoadError(
                f"{self.path}: metadata key {key!r} is {type(value).__name__}, not {kinds[0].__name__}"
            )
        return value

    def string(self, key: str) -> str:
        return str(self._value(key, (str,)))

    def integer(self, key: str) -> int:
        return int(self._value(key, (int, np.integer)))  # type: ignore[arg-type]

    def number(self, key: str) -> float:
        return float(self._value(key, (float, int, np.floating, np.integer)))  # type: ignore[arg-type]

    def boolean(self, key: str) -> bool:
        return bool(self._value(key, (bool, np.bool_)))

    def list_of(self, key: str) -> list:
        return list(self._value(key, (list,)))  # type: ignore[arg-type]

    @property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def tensor_type(self, name: str) -> str:
        return self._tensor(name).tensor_type.name

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor dequantized to float32, shaped as PyTorch orders dims (GGUF lists them reversed)."""
        tensor = self._tensor(name)
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise ModelLoadError(
                f"{self.path}: tensor {name!r} has unsupported type {tensor.tensor_type.name}"
            )
        shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
        try:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            # A copy, so the model does not keep the file's memory map alive.
            array = np.array(values, dtype=np.float32).reshape(shape)
        except Exception as err:
            raise ModelLoadError(f"{self.path}: tensor {name!r} cannot be dequantized ({err})") from err
        return torch.from_numpy(array)

    def _tensor(self, name: str) -> gguf.ReaderTensor:
        tensor = self._tensors.get(name)
        if tensor is None:
            raise ModelLoadError(f"{self.path}: missing tensor {name!r}")
        return tensor
