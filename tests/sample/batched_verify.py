"""Requests through the engine's batched rejection sampler, with hand-built rows: one with the
per-request reference's signature (tests/sample/reference_verify.py), or many seeded ones at once."""

from collections.abc import Sequence

import numpy as np
import torch

from refengine.sample import rng
from refengine.sample.metadata import RowParams, SamplingMetadata
from refengine.sample.rejection_sampler import SpecDecodeMetadata, draft_row_masks, rejection_sample


def verify_batched(
    logits: torch.Tensor,
    draft_ids: Sequence[int],
    params: RowParams,
    history: Sequence[int],
    num_output_tokens: int,
    first_position: int,
    draft_probs: torch.Tensor | None = None,
) -> list[int]:
    """The tokens one request's verify step emits: `logits` holds its k + 1 rows, `draft_probs` its
    [k, V] draft distributions (None: one-hot drafts)."""
    k = len(draft_ids)
    masked: list[list[int]] = [[] for _ in range(k + 1)]
    for row, token in draft_row_masks(params, history, draft_ids, num_output_tokens):
        masked[row].append(token)
    md = SamplingMetadata.build([params] * (k + 1), range(first_position, first_position + k + 1), masked, logits.device)
    probs = None if draft_probs is None else draft_probs[None]
    spec = SpecDecodeMetadata.build([list(draft_ids)], [0], logits.device, probs)
    return [t for t in rejection_sample(logits, md, spec)[0].tolist() if t != -1]


def verify_many(
    logits: torch.Tensor,
    drafts: Sequence[Sequence[int]],
    params: Sequence[RowParams],
    first_position: int,
    draft_probs: torch.Tensor | None = None,
) -> torch.Tensor:
    """[R, k + 1] tokens (-1 after each request's last) of R requests verified in one batch, each with
    the same k + 1 unconstrained logits rows `logits` and, if given, the same [k, V] `draft_probs`:
    request r has drafts[r] and params[r] (its own key), and decides positions first_position ...; many
    seeded draws of one distribution in one call."""
    num, k = len(drafts), logits.shape[0] - 1

    def per_row(values: list) -> np.ndarray:
        return np.repeat(np.asarray(values), k + 1)

    md = SamplingMetadata.from_arrays(
        temperature=per_row([p.temperature for p in params]).astype(np.float32),
        top_p=per_row([p.top_p for p in params]).astype(np.float32),
        top_k=per_row([max(p.top_k, 0) for p in params]).astype(np.int64),
        key_words=per_row(rng.key_word(np.array([p.rng_key for p in params], dtype=np.uint64)).astype(np.int64)),
        positions=np.tile(np.arange(first_position, first_position + k + 1, dtype=np.int64), num),
        masked=[],
        device=logits.device,
    )
    probs = None if draft_probs is None else draft_probs.expand(num, -1, -1)
    spec = SpecDecodeMetadata.build(drafts, range(0, num * (k + 1), k + 1), logits.device, probs)
    return rejection_sample(logits.repeat(num, 1), md, spec)
