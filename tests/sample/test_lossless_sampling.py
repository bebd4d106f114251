"""Speculative sampling at temperature > 0 is lossless: the tokens the engine's batched rejection sampler
emits follow the target's processed distribution (after temperature, top-k and top-p), whatever the
drafts, at every position of a verify step.

vLLM's kind of test: a small vocabulary, fixed target rows (one per position, all different) and fixed
draft distributions unlike them, many seeded requests verified in one batch. At position j the rows
that reach j (their first j drafts accepted) emit a token distributed exactly as the processed target
row j, since nothing before j depends on the draws at j. The empirical distribution is compared with
that row, computed here independently of the sampler, within a total-variation bound derived from the
number of rows that reached j (Bretagnolle-Huber-Carol: P(TV >= t) <= 2^V exp(-2 n t^2), at a
false-alarm probability of 1e-6 per check). Every draw is keyed by its request's seed and position, so
the test is deterministic: it cannot flake, on a loaded machine or any other."""

import math

import numpy as np
import pytest
import torch

from refengine.sample.metadata import RowParams, SamplingMetadata
from refengine.sample.sampler import probabilities_batch
from tests.sample.batched_verify import verify_many

V = 6
NUM_REQUESTS = 12_000
FALSE_ALARM = 1e-6
# Target logits, one row per position (k + 1 <= 5), and draft logits unlike them; fixed by their seeds.
TARGET_LOGITS = torch.randn(5, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 1.5
DRAFT_LOGITS = torch.randn(4, V, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 1.5


def processed(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The target distribution spec-off sampling draws from, written out from the definitions: softmax
    of logits / temperature over the top_k largest, then the smallest most-likely-first prefix whose mass
    reaches top_p, renormalised."""
    z = logits / temperature
    if top_k:
        z = np.where(z >= np.sort(z)[::-1][top_k - 1], z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        mass_before = np.cumsum(p[order]) - p[order]
        kept = np.zeros_like(p)
        kept[order[mass_before < top_p]] = p[order[mass_before < top_p]]
        p = kept / kept.sum()
    return p


def tv_bound(n: int) -> float:
    return math.sqrt((V * math.log(2) + math.log(1 / FALSE_ALARM)) / (2 * n))


def _draw(q: torch.Tensor, seed: int) -> list[list[int]]:
    """NUM_REQUESTS rows of drafts, draft j of each drawn from q[j]."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.multinomial(row, NUM_REQUESTS, replacement=True, generator=generator) for row in q], 1).tolist()


def _verify(k: int, params: tuple[float, int, float], q: torch.Tensor, seed: int) -> torch.Tensor:
    temperature, top_k, top_p = params
    rows = [RowParams(temperature, top_k, top_p, 0, (), (), rng_key=seed * NUM_REQUESTS + r) for r in range(NUM_REQUESTS)]
    return verify_many(TARGET_LOGITS[: k + 1].float(), _draw(q, seed), rows, 100, draft_probs=q)


CASES = [
    (k, (temperature, *filters))
    for k in (1, 2, 4)
    for temperature in (0.5, 1.0, 1.5)
    for filters in ((0, 1.0), (4, 0.8))
]


@pytest.mark.parametrize(("k", "params"), CASES, ids=[f"k{k}-t{p[0]}-topk{p[1]}-topp{p[2]}" for k, p in CASES])
def test_emitted_tokens_follow_the_processed_target_at_every_position(k, params):
    q = torch.softmax(DRAFT_LOGITS[:k], dim=-1).float()
    out = _verify(k, params, q, seed=k)
    drafts = torch.tensor(_draw(q, seed=k))
    accepted = (out != -1).sum(dim=1) - 1
    # Every branch ran: drafts accepted, drafts rejected and recovered (a token other than the draft
    # at the rejected slot), and bonus tokens after k accepted drafts.
    rejected = accepted < k
    recovered = out[rejected, accepted[rejected]] != drafts[rejected, accepted[rejected]]
    assert int(accepted.sum()) > 0 and int(rejected.sum()) > 0 and int(recovered.sum()) > 0
    assert int((accepted == k).sum()) > 0, "no request reached its bonus token"
    for j in range(k + 1):
        emitted = out[:, j][out[:, j] != -1]
        empirical = torch.bincount(emitted, minlength=V).double().numpy() / len(emitted)
        target = processed(TARGET_LOGITS[j].numpy(), *params)
        tv = 0.5 * np.abs(empirical - target).sum()
        assert tv <= tv_bound(len(emitted)), (
            f"position {j}: TV {tv:.4f} from the processed target over {len(emitted)} tokens "
            f"(bound {tv_bound(len(emitted)):.4f})"
        )


@pytest.mark.parametrize("params", [(1.0, 0, 1.0), (0.5, 4, 0.8)], ids=["plain", "filtered"])
def test_drafts_from_the_target_itself_are_all_accepted(params):
    """q = p exactly (the sampler's own processed rows): p / q = 1 >= u for every draft, so every
    request accepts its k drafts and emits its bonus token."""
    k = 4
    temperature, top_k, top_p = params
    row = RowParams(temperature, top_k, top_p, 0, (), (), rng_key=0)
    md = SamplingMetadata.build([row] * k, range(k), [[]] * k, torch.device("cpu"))
    q = probabilities_batch(TARGET_LOGITS[:k].float(), md)
    assert np.allclose(q.numpy(), [processed(TARGET_LOGITS[j].numpy(), *params) for j in range(k)], atol=1e-6)
    out = _verify(k, params, q, seed=7)
    assert bool((out != -1).all()), f"{int((out == -1).any(dim=1).sum())} requests rejected a draft drawn from p"
