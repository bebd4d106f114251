"""Counter-based randomness: a draw depends only on (request key, absolute position, stream, index).

A request's random tokens therefore do not depend on batch composition, chunking, sync or async, or
speculation, which lets the token-identity oracle hold at temperature > 0. `row_seed` mixes (key,
position, stream) into one 32-bit word and `uniforms` mixes it with the counters into float32, in plain
integer arithmetic that never leaves int64's range, so the draws are bitwise equal on Python ints and
on torch tensors of any device. Design: docs/design/oracle.md (why it holds).
"""

from typing import TypeVar

import numpy as np
import torch

# Independent streams, so that the acceptance draw at a position never reuses the noise that
# sampled the token at that position.
STREAM_SAMPLE = 1
STREAM_ACCEPT = 2
STREAM_RECOVER = 3

MASK32 = 0xFFFFFFFF
_GOLDEN32 = 0x9E3779B9

Word = TypeVar("Word", int, torch.Tensor, np.ndarray)


def _mul32(a: Word, c: int) -> Word:
    """(a * c) mod 2**32 for a 32-bit word a and constant c; every partial product stays below 2**49."""
    return ((a & 0xFFFF) * c + (((a >> 16) * (c & 0xFFFF)) << 16)) & MASK32


def _fmix32(h: Word) -> Word:
    """MurmurHash3's 32-bit finaliser: a bijection on 32-bit words that spreads every input bit."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def _absorb(h: Word, word: Word | int) -> Word:
    return _fmix32(((h ^ word) + _GOLDEN32) & MASK32)


def key_word(key: int) -> int:
    """row_seed's first stage: the 64-bit request key's two halves mixed into one 32-bit word. It depends
    on the request alone, so a runner computes it once per request and keeps it in the request's row."""
    return _absorb(_fmix32(key & MASK32), (key >> 32) & MASK32)


def row_seeds(key_words: Word, positions: Word, stream: int) -> Word:
    """row_seed's last stages, for key_word(key) and absolute positions: Python ints, int64 numpy arrays
    or int64 tensors of any device (one seed per row of a batch, without per-row host work)."""
    return _absorb(_absorb(key_words, positions & MASK32), stream)


def row_seed(key: int, position: int, stream: int) -> int:
    """One 32-bit word for a (64-bit request key, position, stream) triple, computed on the host."""
    return row_seeds(key_word(key), position, stream)


def uniforms(seeds: torch.Tensor, size: int) -> torch.Tensor:
    """[rows, size] float32 uniforms in (0, 1) on the seeds' device; column i is counter i of its row.

    The 23 top bits m of the hash as (2m + 1) / 2**24: 24 significant bits, so exact in float32 on
    every device, and never 0 or 1.
    """
    row = seeds.long()[:, None]
    index = torch.arange(size, device=seeds.device)[None, :]  # int64, as every integer arange
    h = _absorb(_absorb(row, index), row)
    return ((h >> 9) * 2 + 1).to(torch.float32) * 2.0**-24


def exponentials(seeds: torch.Tensor, size: int) -> torch.Tensor:
    """[rows, size] Exp(1) noise for the exponential race: argmax(w / E) samples proportionally to w."""
    return -torch.log(uniforms(seeds, size))


def uniform(key: int, position: int, stream: int) -> float:
    """One draw in (0, 1) for one (key, position, stream): counter 0 of that row."""
    return uniforms(torch.tensor([row_seed(key, position, stream)]), 1).item()


def exponential(key: int, position: int, stream: int, size: int) -> torch.Tensor:
    """[size] Exp(1) noise for one (key, position, stream)."""
    return exponentials(torch.tensor([row_seed(key, position, stream)]), size)[0]
