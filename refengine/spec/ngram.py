"""Prompt-lookup drafting on the host: find the latest earlier occurrence of the sequence's suffix
and propose the tokens that followed it. Drafts may be shorter than k, or empty."""

from collections.abc import Sequence


def propose_ngram(token_ids: Sequence[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Longest suffix n-gram (max_n down to min_n) that occurred before; its continuation, up to k."""
    num = len(token_ids)
    for n in range(min(max_n, num - 1), min_n - 1, -1):
        suffix = list(token_ids[num - n :])
        # Scan right to left so the most recent match wins; the match must end before the suffix.
        for start in range(num - n - 1, -1, -1):
            if list(token_ids[start : start + n]) == suffix:
                follow = start + n
                return list(token_ids[follow : follow + k])
    return []
