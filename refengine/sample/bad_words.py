"""bad_words (vLLM's sample/ops/bad_words.py): the tokens that would complete a banned sequence. Torch-free,
so that the sampler's masks and the scheduler's draft validation read the one rule."""

from collections.abc import Sequence


def banned_next_tokens(history: Sequence[int], bad_words: Sequence[Sequence[int]]) -> list[int]:
    """Tokens that would complete a banned sequence, given the committed history."""
    banned = []
    for word in bad_words:
        prefix_len = len(word) - 1
        if prefix_len == 0 or (len(history) >= prefix_len and list(history[-prefix_len:]) == list(word[:-1])):
            banned.append(word[-1])
    return banned
