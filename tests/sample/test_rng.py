"""The counter-based RNG: known answers, a plain-integer statement of the hash, and the properties the
sampler relies on (uniforms in (0, 1), independent of the batch around a row)."""

import random

import numpy as np
import torch

from refengine.sample import rng

MASK32 = 0xFFFFFFFF


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


def _absorb(h: int, word: int) -> int:
    return _fmix32(((h ^ word) + 0x9E3779B9) & MASK32)


def _uniform(key: int, position: int, stream: int, index: int) -> float:
    """The hash in Python's unbounded integers, where a 32-bit product is simply masked."""
    row = _absorb(_absorb(_absorb(_fmix32(key & MASK32), key >> 32), position), stream)
    h = _absorb(_absorb(row, index), row)
    return ((h >> 9) * 2 + 1) * 2.0**-24


def _batch(keys: list[int], positions: list[int], stream: int, size: int) -> torch.Tensor:
    seeds = [rng.row_seed(k, p, stream) for k, p in zip(keys, positions, strict=True)]
    return rng.uniforms(torch.tensor(seeds), size)


def test_known_answers():
    u = _batch([0xDEADBEEFCAFEF00D, 0], [5, 0], rng.STREAM_SAMPLE, 4)
    assert (u * 2**24).long().tolist() == [[6417105, 3915031, 15138255, 13764441], [9653159, 7785411, 52351, 827503]]


def test_torch_int64_arithmetic_equals_the_plain_integer_hash():
    """The 16-bit split keeps every product inside int64: the answer is the exact 32-bit hash for keys
    with their top bits set (where a careless int64 product would overflow)."""
    r = random.Random(17)
    keys = [r.getrandbits(64) for _ in range(6)] + [2**64 - 1, 0]
    positions = [r.randrange(2**31) for _ in keys]
    got = _batch(keys, positions, 3, 5)
    want = [[_uniform(k, p, 3, i) for i in range(5)] for k, p in zip(keys, positions, strict=True)]
    assert got.tolist() == want


def test_the_row_seed_on_tensors_equals_the_row_seed_on_ints():
    """rng's mixing is one piece of integer code for both; on int64 tensors it gives the ints' answer."""
    h = torch.tensor([0, 1, 2**31, 2**32 - 1])
    assert rng._fmix32(h).tolist() == [rng._fmix32(int(x)) for x in h]
    assert rng._fmix32(h).tolist() == [_fmix32(int(x)) for x in h]


def test_rows_do_not_depend_on_the_batch_and_streams_differ():
    alone = _batch([42], [7], rng.STREAM_SAMPLE, 64)
    among = _batch([1, 42, 3], [0, 7, 9], rng.STREAM_SAMPLE, 64)
    assert torch.equal(alone[0], among[1])
    assert not torch.equal(alone, _batch([42], [7], rng.STREAM_ACCEPT, 64))
    assert not torch.equal(alone, _batch([42], [8], rng.STREAM_SAMPLE, 64))


def test_row_seeds_of_tensors_equal_the_hash_of_python_ints():
    """A runner hashes a whole batch's seeds at once (rng.row_seeds of each row's key_word, as int64
    tensors or numpy arrays): the same words as the hash of each (key, position, stream) in Python ints,
    keys past 2**63 included."""
    keys = [0, 1, 0xDEADBEEFCAFEF00D, 2**64 - 1, 2**63 + 12345]
    positions = [0, 7, 2**31 + 5, 123456, 2**32 + 3]
    words = torch.tensor([rng.key_word(k) for k in keys])
    expected = [rng.row_seed(k, p, rng.STREAM_SAMPLE) for k, p in zip(keys, positions, strict=True)]
    assert rng.row_seeds(words, torch.tensor(positions), rng.STREAM_SAMPLE).tolist() == expected
    assert rng.row_seeds(words.numpy(), np.array(positions), rng.STREAM_SAMPLE).tolist() == expected


def test_uniforms_are_uniform_on_the_open_interval():
    u = _batch([123], [4], rng.STREAM_SAMPLE, 200_000)[0]
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.005
    assert abs(float(u.var()) - 1 / 12) < 0.002
    hist = torch.histc(u, bins=16, min=0.0, max=1.0) / u.numel()
    assert float((hist - 1 / 16).abs().max()) < 0.003
