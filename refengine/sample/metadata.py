"""What the sampler needs to know: RowParams per request (host), and SamplingMetadata per logits row,
as tensors on the logits' device (vLLM's name). The metadata is built on the host in one pass over the
rows and sent in non-blocking copies (two, and a third for grammar bitmasks), so sampling a step reads
nothing back from the device."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from refengine.sample import rng


@dataclass(frozen=True, slots=True)
class RowParams:
    """What the sampler needs to know about one request; built by the runner from SamplingParams."""

    temperature: float
    top_k: int  # <= 0 means off
    top_p: float  # 1.0 means off
    min_tokens: int
    stop_token_ids: tuple[int, ...]  # eos (unless ignore_eos) plus the request's stop ids
    bad_words_token_ids: tuple[tuple[int, ...], ...]
    rng_key: int

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class SamplingMetadata:
    temperature: torch.Tensor  # [N] float32; 0 means greedy
    top_p: torch.Tensor  # [N] float32; 1 means off
    top_k: torch.Tensor  # [N] int64; 0 means off
    seeds: torch.Tensor  # [N] int64: rng.row_seed of (request key, the position the row decides, STREAM_SAMPLE)
    masked_rows: torch.Tensor  # [M] int64: (row, token) pairs set to -inf (bad words, min_tokens)
    masked_token_ids: torch.Tensor  # [M] int64
    # Grammar rows: row bitmask_rows[g] may emit token t only if bit t of token_bitmask[g] is set.
    bitmask_rows: torch.Tensor  # [G] int64
    token_bitmask: torch.Tensor  # [G, ceil(vocab / 32)] int32
    # Host facts about the rows, so that the sampler picks its branches without reading the device.
    all_greedy: bool
    any_top_k: bool
    any_top_p: bool
    num_masked: int
    num_bitmask_rows: int

    @classmethod
    def build(
        cls,
        params: Sequence[RowParams],
        positions: Sequence[int],
        masked: Sequence[Sequence[int]],
        device: torch.device,
        bitmask_rows: Sequence[int] = (),
        token_bitmask: np.ndarray | None = None,
    ) -> "SamplingMetadata":
        """One entry per logits row: its request's params, its position and its masked token ids; and
        the grammar bitmask of the rows `bitmask_rows` (row g of `token_bitmask` for bitmask_rows[g])."""
        n = len(params)
        pairs = [(row, token) for row, tokens in enumerate(masked) for token in tokens]
        ints = torch.tensor(
            [max(p.top_k, 0) for p in params]
            # Greedy rows draw no noise: their seed is never read, so spare the host its hashing.
            + [0 if p.greedy else rng.row_seed(p.rng_key, pos, rng.STREAM_SAMPLE) for p, pos in zip(params, positions, strict=True)]
            + [r for r, _ in pairs]
            + [t for _, t in pairs]
            + list(bitmask_rows),
            dtype=torch.int64,
        )
        bitmask = torch.from_numpy(token_bitmask if bitmask_rows else np.zeros((0, 0), dtype=np.int32))
        floats = torch.tensor([p.temperature for p in params] + [p.top_p for p in params], dtype=torch.float32)
        if device.type == "cuda":
            ints = ints.pin_memory().to(device, non_blocking=True)
            floats = floats.pin_memory().to(device, non_blocking=True)
            bitmask = bitmask.pin_memory().to(device, non_blocking=True)
        m = len(pairs)
        return cls(
            temperature=floats[:n],
            top_p=floats[n:],
            top_k=ints[:n],
            seeds=ints[n : 2 * n],
            masked_rows=ints[2 * n : 2 * n + m],
            masked_token_ids=ints[2 * n + m : 2 * n + 2 * m],
            bitmask_rows=ints[2 * n + 2 * m :],
            token_bitmask=bitmask,
            all_greedy=all(p.greedy for p in params),
            any_top_k=any(p.top_k > 0 for p in params),
            any_top_p=any(p.top_p < 1.0 for p in params),
            num_masked=m,
            num_bitmask_rows=len(bitmask_rows),
        )
