"""Which CUDA graph a batch replays: the bucketing of batch sizes shared by the target's graphs
(worker/cuda_graphs.py, which turns them into token counts) and the drafters' proposal graphs
(spec_decode/draft_cuda_graphs.py).

Pure functions of the batch's current size, so that a CPU test checks what only a GPU replays: a batch
replays the smallest captured graph that holds all its rows, chosen afresh for every replay. A size
kept from an earlier, smaller batch would replay a graph whose static buffers cut the extra requests
off, and their drafts (or tokens) would be read from padding."""

from collections.abc import Iterable

# The longest step the target's graphs hold: an admitted request's prefill beside the others' decodes.
# Longer steps spend their time in compute, not in launches, and run eagerly (vLLM caps its captured
# sizes likewise).
MAX_MIXED_TOKENS = 512
MIXED_TOKEN_STEP = 128


def default_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 below max_num_seqs, and max_num_seqs itself."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    sizes += list(range(16, max_num_seqs, 8))
    return sorted(set(sizes + [max_num_seqs]))


def padded_batch_size(num_seqs: int, captured: Iterable[int]) -> int | None:
    """The smallest captured batch size of at least `num_seqs` rows; None when none holds them (the
    batch then runs eagerly)."""
    return min((b for b in captured if b >= num_seqs), default=None)


def graph_token_sizes(batch_sizes: Iterable[int], query_lens: Iterable[int], max_num_batched_tokens: int) -> list[int]:
    """The token counts the target's graphs are captured at: every batch size times every query length
    (uniform decode and verify steps pad no further than to their batch), and every MIXED_TOKEN_STEP up
    to MAX_MIXED_TOKENS for mixed steps; none above the step budget, which no step exceeds, and the budget
    itself when it is below MAX_MIXED_TOKENS, so that every step within it has a graph."""
    lens = list(query_lens)
    sizes = {b * q for b in batch_sizes for q in lens}
    sizes |= set(range(MIXED_TOKEN_STEP, MAX_MIXED_TOKENS + 1, MIXED_TOKEN_STEP))
    sizes.add(min(max_num_batched_tokens, MAX_MIXED_TOKENS))
    return sorted(t for t in sizes if t <= max_num_batched_tokens)
