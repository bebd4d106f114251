"""Which CUDA graph a batch replays: the bucketing of batch sizes shared by the target's decode and
verify graphs (worker/cuda_graphs.py) and the drafters' proposal graphs (spec_decode/draft_cuda_graphs.py).

Pure functions of the batch's current size, so that a CPU test checks what only a GPU replays: a batch
replays the smallest captured graph that holds all its rows, chosen afresh for every replay. A size
kept from an earlier, smaller batch would replay a graph whose static buffers cut the extra requests
off, and their drafts (or tokens) would be read from padding."""

from collections.abc import Iterable


def default_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 below max_num_seqs, and max_num_seqs itself."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    sizes += list(range(16, max_num_seqs, 8))
    return sorted(set(sizes + [max_num_seqs]))


def padded_batch_size(num_seqs: int, captured: Iterable[int]) -> int | None:
    """The smallest captured batch size of at least `num_seqs` rows; None when none holds them (the
    batch then runs eagerly)."""
    return min((b for b in captured if b >= num_seqs), default=None)
