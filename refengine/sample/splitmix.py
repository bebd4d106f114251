"""splitmix64's finaliser, the one integer mixer of the engine: request keys and counter-based draws
are built from it. Torch-free, so the scheduler's side (refengine.request) can use it too."""

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """A bijection on 64-bit ints that spreads every input bit over the output."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)
