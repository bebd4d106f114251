"""SYNTHETIC acceptance, for speed studies only: an accept rule for ModelRunner that accepts draft j with
a fixed probability whatever the target says, so the tokens emitted are NOT the model's.

The draw is counter-based, keyed by request and position (sync and async runs accept the same drafts),
and acceptance stops at the first rejection, as real verification does. The production runner never
imports this module: build_engine passes the rule in only when a study asks for it.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from refengine.sample import rng
from refengine.worker.model_runner import ScheduledRow

# Stream of the synthetic acceptance draws, apart from the sampler's streams.
STREAM_SYNTHETIC_ACCEPT = 101


def synthetic_counts(rate: float, keys: Sequence[int], first_positions: Sequence[int], drafts: np.ndarray) -> np.ndarray:
    """Accepted drafts per row of `drafts` ([rows, width] int64, -1 padded): draft j of row r is accepted
    with probability `rate`, drawn at (keys[r], first_positions[r] + j), independently of the tokens, up
    to the first rejection. A -1 placeholder is always rejected. One batched draw for all rows: the
    per-row Python loop cost milliseconds of host time per step at c = 8, which a study then misread as
    the engine's."""
    rows, width = drafts.shape
    # 64-bit keys (up to 2**64 - 1) fit uint64; rng.key_word works on any integer array.
    key_words = rng.key_word(np.array(keys, dtype=np.uint64)).astype(np.int64)
    positions = np.array(first_positions, dtype=np.int64)[:, None] + np.arange(width, dtype=np.int64)[None, :]
    seeds = rng.row_seeds(key_words[:, None], positions, STREAM_SYNTHETIC_ACCEPT)
    draws = rng.uniforms(torch.from_numpy(seeds.reshape(-1)), 1).numpy().reshape(rows, width)
    # Compared in float64, as a Python float `rate` is: a float32 comparison would round the rate.
    accepted = (drafts >= 0) & (draws.astype(np.float64) < rate)
    return np.cumprod(accepted, axis=1).sum(axis=1)


def synthetic_num_accepted(rate: float, key: int, first_position: int, drafts: tuple[int, ...]) -> int:
    """synthetic_counts for one row."""
    return int(synthetic_counts(rate, [key], [first_position], np.array([drafts], dtype=np.int64).reshape(1, -1))[0])


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
        width = drafts.shape[1]
        # The host's drafts (drafts_by_req), so that nothing here waits for the device's copy.
        padded = np.full((len(rows), width), -1, dtype=np.int64)
        for i, r in enumerate(rows):
            row_drafts = drafts_by_req[r.state.req_id]
            padded[i, : len(row_drafts)] = row_drafts
        counts = synthetic_counts(
            self.rate, [r.state.params.rng_key for r in rows], [r.state.num_tokens for r in rows], padded
        )
        accepted = torch.from_numpy(counts.astype(np.int64))
        if drafts.device.type == "cuda":
            # A pinned copy runs only on a GPU, out of CPU mutation testing's reach.
            accepted = accepted.pin_memory()  # pragma: no mutate
        return accepted.to(drafts.device, non_blocking=True)
