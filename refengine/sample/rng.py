"""Counter-based randomness: a draw depends only on (request key, absolute position, stream).

A request's random tokens therefore do not depend on batch composition, chunking, whether the engine
runs sync or async, or (one-hot drafts being checked against these same samples) whether it speculates.
That is what lets the token-identity oracle hold at temperature > 0.
"""

import torch

from refengine.sample.splitmix import splitmix64

# Independent streams, so that the acceptance draw at a position never reuses the noise that
# sampled the token at that position.
STREAM_SAMPLE = 1
STREAM_ACCEPT = 2
STREAM_RECOVER = 3


def derive_seed(key: int, position: int, stream: int) -> int:
    """A 63-bit seed for one (key, position, stream) triple."""
    return splitmix64(splitmix64(splitmix64(key) ^ position) ^ stream) >> 1


def generator(key: int, position: int, stream: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(derive_seed(key, position, stream))
    return g


def uniform(key: int, position: int, stream: int) -> float:
    """One float64 draw in [0, 1)."""
    return torch.rand((), dtype=torch.float64, generator=generator(key, position, stream)).item()


def exponential(key: int, position: int, stream: int, size: int) -> torch.Tensor:
    """Exp(1) noise for the exponential race: argmax(w / E) samples proportionally to w."""
    return torch.empty(size, dtype=torch.float32).exponential_(generator=generator(key, position, stream))
