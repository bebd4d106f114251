"""Deterministic batches of whole sequences from a distillation set, padded to the longest member.

Sequences are sorted by length and cut into batches of about `batch_tokens` padded positions, so
little compute goes to padding; each epoch visits the batches in an order drawn from the seed.
"""

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from refengine.train.data import DistillSet


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # [B, T + pad] int64, 0 past each sequence
    lengths: torch.Tensor  # [B]
    prompt_lens: torch.Tensor  # [B]
    features: dict[str, torch.Tensor]  # name -> [B, T, H] float32, 0 past each sequence

    @property
    def max_len(self) -> int:
        return int(self.lengths.max())


def plan_batches(data: DistillSet, batch_tokens: int, max_len: int) -> list[list[int]]:
    """Sequence indices per batch: similar lengths together, at most batch_tokens padded positions."""
    lengths = (data.offsets[1:] - data.offsets[:-1]).clamp(max=max_len).tolist()
    order = sorted(range(data.num_sequences), key=lambda b: (lengths[b], b))
    batches: list[list[int]] = []
    current: list[int] = []
    for b in order:
        if current and (len(current) + 1) * lengths[b] > batch_tokens:
            batches.append(current)
            current = []
        current.append(b)
    if current:
        batches.append(current)
    return batches


def collate(data: DistillSet, members: Sequence[int], names: Sequence[str], max_len: int, pad: int) -> Batch:
    """Pad the members to their longest length (capped at max_len); tokens get `pad` extra columns.
    One gather per tensor, on the data's device."""
    device = data.tokens.device
    members_t = torch.tensor(list(members), dtype=torch.long)
    starts = data.offsets[members_t]
    lengths = (data.offsets[members_t + 1] - starts).clamp(max=max_len)
    width = int(lengths.max())
    columns = torch.arange(width + pad)
    inside = columns[None, :] < lengths[:, None]
    index = torch.where(inside, starts[:, None] + columns[None, :], 0).to(device)
    inside = inside.to(device)
    tokens = data.tokens[index] * inside
    features = {n: data.features[n][index[:, :width]].float() * inside[:, :width, None] for n in names}
    prompt_lens = data.prompt_lens[members_t].clamp(max=lengths)
    return Batch(tokens, lengths.to(device), prompt_lens.to(device), features)


def batch_order(num_batches: int, seed: int) -> Iterator[int]:
    """Batch indices forever, epoch after epoch, each epoch in its own seeded order."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield from torch.randperm(num_batches, generator=generator).tolist()


def batch_stream(
    data: DistillSet,
    names: Sequence[str],
    batch_tokens: int,
    max_len: int,
    pad: int,
    seed: int,
    start: int = 0,
) -> Iterator[Batch]:
    """The batches of batch_order, from its `start`-th on: a run resumed after n steps reads the
    batches an uninterrupted run would read from step n."""
    plan = plan_batches(data, batch_tokens, max_len)
    for i in itertools.islice(batch_order(len(plan), seed), start, None):
        yield collate(data, plan[i], names, max_len, pad)
