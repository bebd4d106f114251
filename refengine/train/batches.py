"""Deterministic batches of whole sequences from a distillation set, padded to the longest member.

Sequences are sorted by length and cut into batches of about `batch_tokens` padded positions, so
little compute goes to padding; each epoch visits the batches in an order drawn from the seed.
"""

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
    """Pad the members to their longest length (capped at max_len); tokens get `pad` extra columns."""
    spans = [data.sequence(b) for b in members]
    lengths = torch.tensor([min(end - start, max_len) for start, end in spans])
    width = int(lengths.max())
    tokens = torch.zeros(len(members), width + pad, dtype=torch.long)
    features = {n: torch.zeros(len(members), width, data.features[n].shape[1]) for n in names}
    for row, ((start, _), n) in enumerate(zip(spans, lengths.tolist(), strict=True)):
        tokens[row, :n] = data.tokens[start : start + n]
        for name in names:
            features[name][row, :n] = data.features[name][start : start + n].float()
    prompt_lens = torch.tensor([int(data.prompt_lens[b]) for b in members]).clamp(max=lengths)
    return Batch(tokens, lengths, prompt_lens, features)


def batch_stream(
    data: DistillSet, names: Sequence[str], batch_tokens: int, max_len: int, pad: int, seed: int
) -> Iterator[Batch]:
    """Batches forever, epoch after epoch, each epoch in its own seeded order."""
    plan = plan_batches(data, batch_tokens, max_len)
    generator = torch.Generator().manual_seed(seed)
    while True:
        for i in torch.randperm(len(plan), generator=generator).tolist():
            yield collate(data, plan[i], names, max_len, pad)
