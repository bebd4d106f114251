"""What the proposers that run a network (a head or a draft model) share: the network, k, the KV
layout they draft into, and the per-request context check (invariants 17 and 26 in docs/invariants.md)."""

from collections.abc import Iterable
from typing import TypeVar

import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.spec_decode.context import ContextLengths

_Moved = TypeVar("_Moved", torch.Tensor, AttentionMetadata)


def to_device(value: _Moved, device: torch.device) -> _Moved:
    """A host tensor (or metadata) on `device`: to a GPU from pinned memory, without waiting for it, as
    the runner sends its inputs (a pageable copy would hold the host until the device caught up)."""
    if device.type != "cuda" or (isinstance(value, torch.Tensor) and value.device.type == "cuda"):
        return value  # on the host for the host, or already on the device
    return value.pin_memory().to(device, non_blocking=True)


class NetworkProposer:
    method: str  # names the drafter in context errors

    def __init__(
        self,
        network,
        num_speculative_tokens: int,
        block_size: int,
        max_positions: int,
        *,
        random_init: bool = False,
    ) -> None:
        self.network = network
        self.k = num_speculative_tokens
        self.block_size = block_size
        self.max_positions = max_positions
        self.random_init = random_init
        self.context = ContextLengths(self.method)
        # Host reads of drafted ids (each waits for the device): one per drafting step for the heads,
        # one per pass for the sync-only draft model.
        self.num_readbacks = 0

    @property
    def capture_layers(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.network.capture_layers)))

    def remove(self, req_ids: Iterable[str]) -> None:
        self.context.remove(req_ids)
