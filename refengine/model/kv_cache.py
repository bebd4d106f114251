"""The paged key/value store: per layer, fixed-size blocks of token slots."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refengine.model.config import ModelConfig


@dataclass(frozen=True, slots=True)
class LayerKVCache:
    """`key` and `value` are `[num_blocks, block_size, num_kv_heads, head_dim]`."""

    key: torch.Tensor
    value: torch.Tensor


@dataclass(frozen=True, slots=True)
class KVCache:
    layers: tuple[LayerKVCache, ...]

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> KVCache:
        shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        return cls(
            layers=tuple(
                LayerKVCache(
                    key=torch.zeros(shape, dtype=dtype, device=device),
                    value=torch.zeros(shape, dtype=dtype, device=device),
                )
                for _ in range(config.num_hidden_layers)
            )
        )

    def to(self, device: torch.device | str) -> KVCache:
        return KVCache(
            layers=tuple(LayerKVCache(layer.key.to(device), layer.value.to(device)) for layer in self.layers)
        )

    @property
    def device(self) -> torch.device:
        return self.layers[0].key.device

    @property
    def num_blocks(self) -> int:
        return self.layers[0].key.shape[0]

    @property
    def block_size(self) -> int:
        return self.layers[0].key.shape[1]
