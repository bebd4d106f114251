"""The per-request reference verifier: the oracle the engine's batched rejection sampler
(refengine/sample/rejection_sampler.py) must equal, row for row (tests/worker/test_batched_verify.py).
Written the textbook way, one request and one row at a time (Leviathan et al., 2211.17192), with its
own one-row sampling helpers, so that it shares no batching code with what it checks.

Per request the verifier sees k+1 target rows for the query [t, d1..dk]:
row j verifies draft d_{j+1}; row k samples the bonus token, emitted only when every draft is
accepted. A draft of -1 (a placeholder that was never filled, or a constraint-invalid draft) is always
rejected.

Every drafter in this engine proposes one-hot (greedy) drafts. For those, draft x at a row is accepted
exactly when the target's own seeded sample at that position is x, and on a mismatch that sample is
emitted. Acceptance then has probability p(x) and the emitted token is distributed as p, as under
rejection sampling (for q one-hot at x: accept with min(1, p(x)), recover from p with x removed); and
since the sample is keyed by position, spec-on output equals spec-off output token for token. Drafters
that pass draft probabilities get the rejection sampler proper.
"""

from collections.abc import Sequence

import torch

from refengine.sample import rng
from refengine.sample.metadata import SamplingMetadata
from refengine.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID
from refengine.sample.sampler import RowParams, apply_constraints, probabilities_batch, sample_batch


def _one_row(params: RowParams, position: int, device: torch.device) -> SamplingMetadata:
    return SamplingMetadata.build([params], [position], [[]], device)


def probabilities(logits: torch.Tensor, params: RowParams) -> torch.Tensor:
    """One row's distribution (probabilities_batch on a batch of one)."""
    return probabilities_batch(logits[None], _one_row(params, 0, logits.device))[0]


def race(weights: torch.Tensor, key: int, position: int, stream: int) -> int:
    """A sample proportional to `weights` (need not be normalised), keyed by (key, position)."""
    noise = rng.exponential(key, position, stream, weights.numel()).to(weights.device)
    return int(torch.argmax(weights / noise).item())


def sample(logits: torch.Tensor, params: RowParams, position: int) -> int:
    """One token for the sequence position `position` from one row of processed logits (sample_batch on
    a batch of one)."""
    return int(sample_batch(logits[None], _one_row(params, position, logits.device))[0].item())


def num_accepted_greedy(draft_ids: Sequence[int], target_ids: Sequence[int]) -> int:
    """Drafts accepted while each equals the target's token at its row: its argmax, or under sampling
    its seeded sample (one-hot drafts). Accepted drafts are a prefix."""
    num = 0
    for draft, target in zip(draft_ids, target_ids):
        if draft != target:
            break
        num += 1
    return num


def num_accepted_random(
    draft_ids: Sequence[int],
    target_probs: Sequence[float],
    draft_probs: Sequence[float],
    uniforms: Sequence[float],
) -> int:
    """Accept d_j iff q(d_j) > 0 and p(d_j) / q(d_j) >= u_j; stop at the first rejection."""
    for j, draft in enumerate(draft_ids):
        if draft < 0 or draft_probs[j] <= 0.0 or target_probs[j] / draft_probs[j] < uniforms[j]:
            return j
    return len(draft_ids)


def assemble(draft_ids: Sequence[int], num_accepted: int, final_token: int) -> list[int]:
    """The tokens a verify step emits: the accepted drafts, then one recovered or bonus token."""
    return [*draft_ids[:num_accepted], final_token]


def pad_rows(rows: Sequence[Sequence[int]], width: int) -> list[list[int]]:
    """The [B, k+1] output layout, padded with -1."""
    return [[*row, *([PLACEHOLDER_TOKEN_ID] * (width - len(row)))] for row in rows]


def verify(
    logits: torch.Tensor,
    draft_ids: Sequence[int],
    params: RowParams,
    history: Sequence[int],
    num_output_tokens: int,
    first_position: int,
    draft_probs: torch.Tensor | None = None,
) -> list[int]:
    """Verify one request's drafts.

    `logits` holds its k+1 target rows; `first_position` is the sequence position of the token that
    row 0 decides. Row j is processed as if drafts[:j] had been accepted (bad words and min_tokens see
    that history). `draft_probs` ([k, V]) is None for one-hot drafts, the only kind this engine's
    drafters propose.
    """
    k = len(draft_ids)
    rows = [
        apply_constraints(logits[j], params, [*history, *draft_ids[:j]], num_output_tokens + j)
        for j in range(k + 1)
    ]
    if params.greedy or draft_probs is None:
        # One-hot drafts: the target's token at row j is the one spec-off decoding would emit at that
        # position (its argmax, or its sample keyed by the position), so the output never depends on
        # the drafts, only the number of steps does.
        target_ids = [sample(row, params, first_position + j) for j, row in enumerate(rows)]
        accepted = num_accepted_greedy(draft_ids, target_ids)
        return assemble(draft_ids, accepted, target_ids[accepted])

    probs = [probabilities(row, params) for row in rows[:k]]
    target_p = [float(p[d].item()) if d >= 0 else 0.0 for p, d in zip(probs, draft_ids)]
    draft_q = [float(draft_probs[j, d].item()) if d >= 0 else 0.0 for j, d in enumerate(draft_ids)]
    # One independent uniform per row: rows sharing a draw would accept or reject together.
    uniforms = [rng.uniform(params.rng_key, first_position + j, rng.STREAM_ACCEPT) for j in range(k)]
    accepted = num_accepted_random(draft_ids, target_p, draft_q, uniforms)
    position = first_position + accepted
    if accepted == k:
        return assemble(draft_ids, accepted, sample(rows[k], params, position))
    return assemble(
        draft_ids,
        accepted,
        recover(probs[accepted], draft_ids[accepted], draft_probs, accepted, params, position),
    )


def recover(
    target_probs: torch.Tensor,
    draft_id: int,
    draft_probs: torch.Tensor,
    row: int,
    params: RowParams,
    position: int,
) -> int:
    """A sample from normalize(max(0, p - q)) at the first rejected row, which keeps random verification
    lossless."""
    if draft_id < 0:
        residual = target_probs
    else:
        residual = torch.clamp(target_probs - draft_probs[row], min=0.0)
    if float(residual.sum()) <= 0.0:
        residual = target_probs
    return race(residual, params.rng_key, position, rng.STREAM_RECOVER)
