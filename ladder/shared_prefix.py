"""The shared-prefix workload (vLLM's prefix-repetition dataset): every random prompt is one of
--num-prefixes fixed prefixes of --prefix-len tokens, then its own suffix of --input-len tokens. The
prefixes are seeded by the run's seed alone, so every rung shares them; the per-run nonce goes before the
prefix, so prompts of one run still share it while no earlier run's cache serves it."""

import random
from dataclasses import dataclass

from ladder.config import SetupError
from ladder.prompts import Sizer


@dataclass(frozen=True)
class SharedPrefixes:
    texts: tuple[str, ...]

    def sizer(self, suffix: Sizer) -> Sizer:
        """Prompts of one of the prefixes (chosen by the rung's own seeded draw), then a suffix."""
        return lambda rng: f"{rng.choice(self.texts)}\n{suffix(rng)}"


def shared_prefixes(seed: int, num_prefixes: int, sizer: Sizer) -> SharedPrefixes:
    if num_prefixes < 1:
        raise SetupError(f"--num-prefixes must be at least 1, got {num_prefixes}")
    rng = random.Random(f"ladder-prefix:{seed}")
    return SharedPrefixes(tuple(sizer(rng) for _ in range(num_prefixes)))
