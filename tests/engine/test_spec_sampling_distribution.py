"""Speculative decoding samples the target's distribution through the whole engine, at temperature 1.0
with top-k and top-p: a distribution test, not an identity test.

tiny-qwen3 decodes one prompt for many seeds, spec on (a self-draft of all its layers: its greedy
drafts are accepted at about the rate of the target's top token, so the first verify step emits one,
two or three tokens) and spec off, on disjoint seeds. The joint distribution of the prefill's token and
the k + 1 tokens after it (those the first verify step decides) must be the same: a chi-square test of
homogeneity on the two histograms, at a false-alarm probability of 1e-4. Every draw is keyed by its
request's seed and position, so the test is deterministic under its seeds."""

import math
from collections import Counter

import pytest

from refengine.engine.llm import LLM
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig

K = 2
NUM_SEEDS = 160
PROMPT = [5, 17, 42, 9, 3, 77, 12]
ENGINE = dict(num_blocks=512, block_size=4, max_model_len=32, max_num_seqs=NUM_SEEDS)
Z_FALSE_ALARM = 3.719  # the standard normal's 1 - 1e-4 quantile


def chi_square_quantile(dof: int) -> float:
    """Wilson-Hilferty: the chi-square(dof) quantile at the normal quantile Z_FALSE_ALARM."""
    return dof * (1 - 2 / (9 * dof) + Z_FALSE_ALARM * math.sqrt(2 / (9 * dof))) ** 3


def homogeneity(a: Counter, b: Counter) -> tuple[float, int]:
    """Pearson's chi-square of a 2 x C table of two samples' counts (cells whose expected count is
    under 5 pooled into one), and its degrees of freedom."""
    na, nb = sum(a.values()), sum(b.values())
    rows, pooled = [], [0, 0]
    for cell in a.keys() | b.keys():
        if (a[cell] + b[cell]) * min(na, nb) / (na + nb) < 5:
            pooled[0] += a[cell]
            pooled[1] += b[cell]
        else:
            rows.append((a[cell], b[cell]))
    if sum(pooled):
        rows.append(tuple(pooled))
    stat = 0.0
    for ca, cb in rows:
        total = ca + cb
        for count, n in ((ca, na), (cb, nb)):
            expected = total * n / (na + nb)
            stat += (count - expected) ** 2 / expected
    return stat, len(rows) - 1


def _generate(seeds: range, speculative_config: SpeculativeConfig | None):
    llm = LLM("tiny-qwen3", **ENGINE, speculative_config=speculative_config, record_steps=True)
    params = [
        SamplingParams(temperature=1.0, top_k=2, top_p=0.95, max_tokens=K + 2, seed=s, ignore_eos=True) for s in seeds
    ]
    return llm.generate([PROMPT] * len(seeds), params)


@pytest.fixture(scope="module")
def spec_off():
    return _generate(range(NUM_SEEDS, 2 * NUM_SEEDS), None)


def test_the_first_verify_step_emits_the_spec_off_distribution(spec_off):
    spec_on = _generate(range(NUM_SEEDS), SpeculativeConfig("draft_model", K, num_draft_layers=8))
    first_verify = [next(r for r in o.steps if r.draft_token_ids) for o in spec_on]
    accepted = Counter(r.num_accepted for r in first_verify)
    # Rejections, partial acceptances and bonus tokens all ran.
    assert all(accepted[n] > 0 for n in range(K + 1)), accepted
    on = Counter(tuple(o.token_ids[: K + 2]) for o in spec_on)
    off = Counter(tuple(o.token_ids[: K + 2]) for o in spec_off)
    stat, dof = homogeneity(on, off)
    assert dof >= 4, (on, off)  # enough distinct outcomes for the test to mean something
    assert stat <= chi_square_quantile(dof), f"chi-square {stat:.1f} on {dof} dof: spec on {on}, spec off {off}"
