"""SYNTHETIC acceptance, for speed studies only: an accept rule for ModelRunner that accepts draft j with
a fixed probability whatever the target says, so the tokens emitted are NOT the model's.

The draw is counter-based, keyed by request and position (sync and async runs accept the same drafts),
and acceptance stops at the first rejection, as real verification does. It runs on the device from the
step's device facts (keys, exact positions, drafts), so that a study's spec step waits on the host no
more than a real one. The production runner never imports this module: build_engine passes the rule in
only when a study asks for it.
"""

from dataclasses import dataclass

import torch

from refengine.sample import rng

# Stream of the synthetic acceptance draws, apart from the sampler's streams.
STREAM_SYNTHETIC_ACCEPT = 101


def synthetic_counts(
    rate: float, key_words: torch.Tensor, first_positions: torch.Tensor, drafts: torch.Tensor
) -> torch.Tensor:
    """Accepted drafts per row of `drafts` ([rows, width] int64, -1 padded): draft j of row r is accepted
    with probability `rate`, drawn at (key_words[r], first_positions[r] + j), independently of the
    tokens, up to the first rejection. A -1 placeholder is always rejected. One batched draw for all
    rows, on their device."""
    rows, width = drafts.shape
    positions = first_positions[:, None] + torch.arange(width, dtype=torch.int64, device=drafts.device)[None, :]
    seeds = rng.row_seeds(key_words[:, None], positions, STREAM_SYNTHETIC_ACCEPT)
    draws = rng.uniforms(seeds.reshape(-1), 1).reshape(rows, width)
    # Compared in float64, as a Python float `rate` is: a float32 comparison would round the rate.
    accepted = (drafts >= 0) & (draws.double() < rate)
    return torch.cumprod(accepted.long(), dim=1).sum(dim=1)


def synthetic_num_accepted(rate: float, key: int, first_position: int, drafts: tuple[int, ...]) -> int:
    """synthetic_counts for one row, from its request key."""
    row = torch.tensor([drafts], dtype=torch.int64).reshape(1, -1)
    return int(synthetic_counts(rate, torch.tensor([rng.key_word(key)]), torch.tensor([first_position]), row)[0])


@dataclass(frozen=True, slots=True)
class SyntheticAcceptance:
    rate: float

    def __call__(
        self, drafts: torch.Tensor, targets: torch.Tensor, key_words: torch.Tensor, first_positions: torch.Tensor
    ) -> torch.Tensor:
        return synthetic_counts(self.rate, key_words, first_positions, drafts)
