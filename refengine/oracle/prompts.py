"""The oracle's prompt sets: varied text for real tokenizers, seeded token ids for tiny models."""

import random

from refengine.tokenizer.tokenizer import Tokenizer

# The two repetitive ones come early, so that every prompt count from 4 on gives prompt lookup (ngram)
# something to find, and it can reach the vacuity bar.
TEXT_PROMPTS = (
    "The history of the printing press begins",
    "def merge_sort(items):\n    ",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "List of prime numbers: 2, 3, 5, 7, 11,",
    "Q: What is the boiling point of water at sea level?\nA:",
    "Dear team, I am writing to let you know that",
    "The three primary colors are",
    "import numpy as np\n\n# compute the mean of each column\n",
    "Once upon a time, in a small village by the sea,",
    "To make a cup of tea, first",
)


def text_prompts(tokenizer: Tokenizer, num: int) -> list[list[int]]:
    return [
        tokenizer.encode(TEXT_PROMPTS[i % len(TEXT_PROMPTS)] + ("" if i < len(TEXT_PROMPTS) else f" ({i})"))
        for i in range(num)
    ]


# The shared-prefix workload: every prompt behind one prefix this long, then every prompt again whole.
SHARED_PREFIX_LEN = 32


def shared_prefix_prompts(prompts: list[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """The prefix-cache workload over a prompt set: each prompt behind a shared prefix made of the
    prompts' own tokens, then the same prompts again, so that later requests hit the prefix and whole
    prompts (as many requests as prompts wait behind the first c, so they are admitted after a hit)."""
    pool = [t for p in prompts for t in p]
    prefix = tuple((pool * (SHARED_PREFIX_LEN // len(pool) + 1))[:SHARED_PREFIX_LEN])
    shared = tuple(prefix + tuple(p) for p in prompts)
    return shared + shared


def token_prompts(vocab_size: int, num: int, seed: int) -> list[list[int]]:
    """Different lengths, with repeats, so that prompt lookup has something to find."""
    rng = random.Random(seed)
    prompts = []
    for i in range(num):
        base = [rng.randrange(3, min(vocab_size, 256)) for _ in range(3 + i % 4)]
        prompts.append((base * 4)[: 5 + 3 * (i % 5)])
    return prompts
