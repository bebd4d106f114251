"""The batched rejection sampler (Leviathan et al., 2211.17192; vLLM's RejectionSampler): every verified
request of a step in one pass over plain tensors on the logits' device, with nothing read back.

Per request, k + 1 processed rows verify drafts d1..dk and sample the bonus token. One-hot drafts are
accepted exactly when the target's position-keyed sample equals them, so spec-on output equals spec-off
output; drafts with probabilities get rejection sampling proper (invariants 23 and 24 in
docs/invariants.md). Design: docs/design/spec-decode.md (verification).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from refengine.model.device import to_device
from refengine.sample import rng
from refengine.sample.metadata import RowParams, SamplingMetadata
from refengine.sample.sampler import apply_masks, masked_token_ids, probabilities_batch, sample_masked

PLACEHOLDER_TOKEN_ID = -1

# (drafts [R, W], target samples at their rows [R, W]) -> [R] accepted drafts of each request.
AcceptRule = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class StepAcceptRule(Protocol):
    """A rule that replaces verification's acceptance for speed studies (synthetic_acceptance.py)."""

    def __call__(
        self, drafts: torch.Tensor, targets: torch.Tensor, key_words: torch.Tensor, first_positions: torch.Tensor
    ) -> torch.Tensor:
        """[R] accepted drafts of each row, from its [R, width] drafts (padded with -1), the targets at
        their positions, its request's key word and the position its first draft decides, on their
        device."""
        ...


def accept_matching_prefix(drafts: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The one-hot rule: drafts are accepted while they equal their targets (-1 never does)."""
    matches = drafts == targets
    return torch.cumprod(matches.long(), dim=1).sum(dim=1)


def draft_row_masks(
    params: RowParams, history: Sequence[int], drafts: Sequence[int], num_output_tokens: int
) -> list[tuple[int, int]]:
    """(row j, token) pairs the constraints forbid on a request's k + 1 verify rows: row j sees the
    committed history plus drafts[:j] and num_output_tokens + j outputs, as spec-off decoding would.
    Only the history's tail a banned word's prefix can match is read."""
    if not params.bad_words_token_ids and num_output_tokens >= params.min_tokens:
        return []  # unconstrained: no per-row host work
    tail = max((len(w) for w in params.bad_words_token_ids), default=1) - 1
    recent = list(history[max(0, len(history) - tail) :]) if tail else []
    return [
        (j, token)
        for j in range(len(drafts) + 1)
        for token in masked_token_ids(params, [*recent, *drafts[:j]], num_output_tokens + j)
    ]


def padded_draft_ids(drafts: Sequence[Sequence[int]]) -> np.ndarray:
    """[R, W] each request's drafts on the host, -1 padded to the widest."""
    width = max((len(d) for d in drafts), default=0)
    padded = np.full((len(drafts), width), PLACEHOLDER_TOKEN_ID, dtype=np.int64)
    for r, row in enumerate(drafts):
        padded[r, : len(row)] = row
    return padded


@dataclass(frozen=True, slots=True)
class SpecDecodeMetadata:
    """Where each verified request's drafts and logits rows are (vLLM's name), on the logits' device."""

    draft_token_ids: torch.Tensor  # [R, W] int64: request r's drafts, -1 past its num_drafts
    num_draft_tokens: torch.Tensor  # [R] int64: k of each request
    target_logits_indices: torch.Tensor  # [R, W + 1] int64: logits row of slot j (row 0's past k)
    draft_probs: torch.Tensor | None = None  # [R, W, V] float32: q of each draft's row; None: one-hot

    @classmethod
    def build(
        cls,
        drafts: Sequence[Sequence[int]],
        first_logits_rows: Sequence[int],
        device: torch.device,
        draft_probs: torch.Tensor | None = None,
    ) -> "SpecDecodeMetadata":
        """From each request's drafts and its first logits row (its k + 1 rows are consecutive), in one
        host-to-device copy."""
        num = np.fromiter((len(d) for d in drafts), dtype=np.int64, count=len(drafts))
        width = int(num.max(initial=0))
        if width == 0 and list(first_logits_rows) == list(range(len(drafts))):
            # No drafts, one logits row per request in order (every step without speculation): the
            # indices are made on the device, with no host-to-device copy.
            none = torch.zeros(len(drafts), 0, dtype=torch.long, device=device)
            index = torch.arange(len(drafts), dtype=torch.long, device=device)[:, None]
            return cls(none, none.new_zeros(len(drafts)), index, draft_probs)
        padded = padded_draft_ids(drafts)
        slots = np.arange(width + 1, dtype=np.int64)[None, :]
        first = np.asarray(first_logits_rows, dtype=np.int64)[:, None]
        index = first + np.where(slots <= num[:, None], slots, 0)
        ints = to_device(torch.from_numpy(np.concatenate([padded.ravel(), num, index.ravel()])), device)
        n = padded.size
        return cls(
            draft_token_ids=ints[:n].view(len(drafts), width),
            num_draft_tokens=ints[n : n + len(drafts)],
            target_logits_indices=ints[n + len(drafts) :].view(len(drafts), width + 1),
            draft_probs=draft_probs,
        )


def rejection_sample(
    logits: torch.Tensor,
    md: SamplingMetadata,
    spec: SpecDecodeMetadata,
    accept: AcceptRule = accept_matching_prefix,
) -> torch.Tensor:
    """[R, W + 1] emitted tokens of each request (its accepted drafts, then one recovered or bonus
    token), -1 after them. `logits` are the step's raw [N, V] target rows, `md` their per-row params;
    `accept` decides one-hot acceptance (verification, unless a speed study swaps in a synthetic rule)."""
    masked = apply_masks(logits, md)
    target_rows = sample_masked(masked, md)[spec.target_logits_indices]  # [R, W + 1]
    drafts = spec.draft_token_ids
    width = drafts.shape[1]
    if width == 0:
        return target_rows
    # Accepted one-hot drafts equal their targets, so a request's tokens are its targets up to and
    # including the first unaccepted row.
    accepted = accept(drafts, target_rows[:, :width])
    emitted = target_rows
    if spec.draft_probs is not None and not md.all_greedy:
        random_accepted, random_emitted = _random_verify(masked, md, spec, target_rows)
        random_row = md.temperature[spec.target_logits_indices[:, 0]] > 0.0  # greedy rows stay one-hot
        accepted = torch.where(random_row, random_accepted, accepted)
        emitted = torch.where(random_row[:, None], random_emitted, emitted)
    keep = torch.arange(width + 1, device=drafts.device)[None, :] <= accepted[:, None]
    return torch.where(keep, emitted, PLACEHOLDER_TOKEN_ID)


def _random_verify(
    masked: torch.Tensor, md: SamplingMetadata, spec: SpecDecodeMetadata, target_rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling proper: each request's accepted count and its [W + 1] tokens (its drafts, then
    the recovered or bonus token at the accepted count)."""
    drafts, index, num_drafts = spec.draft_token_ids, spec.target_logits_indices, spec.num_draft_tokens
    draft_probs = spec.draft_probs
    width = drafts.shape[1]
    slots = torch.arange(width + 1, device=drafts.device)[None, :]
    processed = probabilities_batch(masked, md)[index]  # [R, W + 1, V]: p of each slot
    real = drafts >= 0
    safe = drafts.clamp(min=0)[:, :, None]
    p = processed[:, :width].gather(2, safe)[:, :, 0]
    q = draft_probs.gather(2, safe)[:, :, 0]
    # One independent uniform per row, keyed by its position: rows sharing a draw would accept together.
    accept_seeds = rng.row_seeds(md.key_words, md.positions, rng.STREAM_ACCEPT)
    uniforms = rng.uniforms(accept_seeds, 1).squeeze(1)[index[:, :width]]
    # Accept iff p / q >= u, in float64, where the ratio of two float32 probabilities is exact.
    ok = real & (q > 0.0) & (p.double() / q.double() >= uniforms.double()) & (slots[:, :width] < num_drafts[:, None])
    accepted = torch.cumprod(ok.long(), dim=1).sum(dim=1)
    # The first rejected slot (any slot when none is): a sample of normalize(max(0, p - q)) there, keyed
    # by its position; p itself for a -1 draft or an empty residual.
    at = accepted.clamp(max=width - 1)
    requests = torch.arange(drafts.shape[0], device=drafts.device)
    target_at, draft_at = processed[requests, at], draft_probs[requests, at]  # [R, V] each
    residual = torch.where(real[requests, at][:, None], (target_at - draft_at).clamp(min=0.0), target_at)
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0.0, residual, target_at)
    row_at = index[requests, at]
    recover_seeds = rng.row_seeds(md.key_words[row_at], md.positions[row_at], rng.STREAM_RECOVER)
    recovered = torch.argmax(residual / rng.exponentials(recover_seeds, processed.shape[2]), dim=1)
    # Every draft accepted: the bonus slot's own sample, at the position after the last draft.
    bonus = target_rows.gather(1, num_drafts[:, None])[:, 0]
    final = torch.where(accepted == num_drafts, bonus, recovered)
    padded = torch.cat([drafts, drafts.new_full((drafts.shape[0], 1), PLACEHOLDER_TOKEN_ID)], dim=1)
    return accepted, torch.where(slots == accepted[:, None], final[:, None], padded)
