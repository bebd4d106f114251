"""What the proposers that run a network (a head or a draft model) share: the network, k, the KV
layout they draft into, and the per-request context check (invariants 17 and 26 in docs/invariants.md)."""

from collections.abc import Iterable

from torch import nn

from refengine.spec_decode.context import ContextLengths


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

    # The capability the Proposer protocol declares: none here; fixed_shape_proposer.py declares itself.
    device_drafter = None

    @property
    def modules(self) -> tuple[nn.Module, ...]:
        return (self.network,)
