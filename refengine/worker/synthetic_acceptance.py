"""SYNTHETIC acceptance, for speed studies only: an accept rule for ModelRunner that accepts draft j with
a fixed probability whatever the target says, so the tokens emitted are NOT the model's.

The draw is counter-based, keyed by request and position (sync and async runs accept the same drafts),
and acceptance stops at the first rejection, as real verification does. The production runner never
imports this module: build_engine passes the rule in only when a study asks for it.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from refengine.sample import rng
from refengine.worker.model_runner import ScheduledRow

# Stream of the synthetic acceptance draws, apart from the sampler's streams.
STREAM_SYNTHETIC_ACCEPT = 101


def synthetic_num_accepted(rate: float, key: int, first_position: int, drafts: tuple[int, ...]) -> int:
    """Draft j is accepted with probability `rate`, independently of the tokens, up to the first
    rejection. A -1 placeholder is always rejected."""
    for j, draft in enumerate(drafts):
        if draft < 0 or rng.uniform(key, first_position + j, STREAM_SYNTHETIC_ACCEPT) >= rate:
            return j
    return len(drafts)


@dataclass(frozen=True, slots=True)
class SyntheticAcceptance:
    rate: float

    def __call__(
        self,
        drafts: torch.Tensor,
        targets: torch.Tensor,
        rows: Sequence[ScheduledRow],
        drafts_by_req: Mapping[str, tuple[int, ...]],
    ) -> torch.Tensor:
        counts = [
            synthetic_num_accepted(self.rate, r.state.params.rng_key, r.state.num_tokens, drafts_by_req[r.state.req_id])
            for r in rows
        ]
        accepted = torch.tensor(counts, dtype=torch.int64)
        if drafts.device.type == "cuda":
            # A pinned copy runs only on a GPU, out of CPU mutation testing's reach.
            accepted = accepted.pin_memory()  # pragma: no mutate
        return accepted.to(drafts.device, non_blocking=True)
