"""Per-request lengths of random prompts: every request the same length, or drawn around it, as
`vllm bench serve`'s random dataset does with --random-range-ratio.

uniform: an integer in [L·(1 - r), L·(1 + r)]; normal: mean L and standard deviation r·L, rounded and
clipped to the same range. Seeded per (seed, rung, phase), so a rung's lengths repeat run to run.
"""

import random
from dataclasses import dataclass

KINDS = ("uniform", "normal")


@dataclass(frozen=True)
class LengthDist:
    kind: str = "uniform"
    range_ratio: float = 0.0  # 0: every request exactly L

    def draw(self, rng: random.Random, length: int, floor: int) -> int:
        """One length around `length`, never below `floor`."""
        lo, hi = max(floor, round(length * (1 - self.range_ratio))), max(floor, round(length * (1 + self.range_ratio)))
        if self.range_ratio == 0:
            return max(floor, length)
        if self.kind == "uniform":
            return rng.randint(lo, hi)
        return min(hi, max(lo, round(rng.gauss(length, self.range_ratio * length))))
