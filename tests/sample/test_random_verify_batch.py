"""Random verification of many requests in one batch equals the per-request reference
(tests/sample/reference_verify.py) request by request: different k, temperatures, top-k and top-p,
positions and keys; draft probabilities with zeros at the draft (never accepted), and ones everywhere
(q >= p: an empty residual, so the recovered token comes from p), in the same batch as requests with
an ordinary residual. And the acceptance rule's tie, p / q = u exactly, accepts."""

from fractions import Fraction

import torch

from refengine.sample import rng
from refengine.sample.metadata import RowParams, SamplingMetadata
from refengine.sample.rejection_sampler import SpecDecodeMetadata, rejection_sample
from refengine.sample.sampler import probabilities_batch
from tests.sample.reference_verify import verify

CPU = torch.device("cpu")
V = 12


def _request(generator: torch.Generator, index: int) -> dict:
    k = index % 4
    temperature = (0.0, 0.7, 1.0, 1.4)[index % 4 if index % 5 else 0]
    params = RowParams(temperature, (0, 4)[index % 2], (1.0, 0.8)[(index // 2) % 2], 0, (), (), rng_key=1000 + index)
    logits = torch.randn(k + 1, V, generator=generator) * 1.5
    drafts = torch.randint(0, V, (k,), generator=generator).tolist()
    if index % 7 == 3 and k:
        drafts[-1] = -1  # a placeholder: always rejected
    kind = index % 3
    if kind == 0:  # q = 0 at the first draft: never accepted, whatever p is
        q = torch.softmax(torch.randn(k, V, generator=generator), dim=-1)
        if k:
            q[0, drafts[0]] = 0.0
    elif kind == 1:  # q >= p everywhere: a rejected draft leaves an empty residual
        q = torch.ones(k, V)
    else:
        q = torch.softmax(torch.randn(k, V, generator=generator) * 2, dim=-1)
    return {"logits": logits, "drafts": drafts, "params": params, "first_position": 3 * index + 1, "q": q}


def _verify_batch(requests: list[dict]) -> list[list[int]]:
    width = max(len(r["drafts"]) for r in requests)
    rows, params, positions, first_rows = [], [], [], []
    draft_probs = torch.zeros(len(requests), width, V)
    for i, r in enumerate(requests):
        k = len(r["drafts"])
        first_rows.append(len(rows))
        rows += list(r["logits"])
        params += [r["params"]] * (k + 1)
        positions += range(r["first_position"], r["first_position"] + k + 1)
        draft_probs[i, :k] = r["q"]
    md = SamplingMetadata.build(params, positions, [[]] * len(params), CPU)
    spec = SpecDecodeMetadata.build([r["drafts"] for r in requests], first_rows, CPU, draft_probs)
    out = rejection_sample(torch.stack(rows), md, spec)
    return [[t for t in row if t != -1] for row in out.tolist()]


def test_batched_random_verification_equals_the_reference_request_by_request():
    generator = torch.Generator().manual_seed(11)
    outcomes = {"accepted all": 0, "q = 0 rejected": 0, "empty residual": 0, "recovered": 0}
    for batch in range(12):
        requests = [_request(generator, 8 * batch + i) for i in range(8)]
        for r, got in zip(requests, _verify_batch(requests)):
            want = verify(r["logits"], r["drafts"], r["params"], [], 0, r["first_position"], r["q"])
            assert got == want, f"drafts {r['drafts']} params {r['params']}"
            k, accepted = len(r["drafts"]), len(got) - 1
            if r["params"].greedy or not k:
                continue
            if accepted == k:
                outcomes["accepted all"] += 1
            elif accepted == 0 and r["q"][0, r["drafts"][0]] == 0.0:
                outcomes["q = 0 rejected"] += 1
            elif bool((r["q"] == 1.0).all()):
                outcomes["empty residual"] += 1
            else:
                outcomes["recovered"] += 1
    assert min(outcomes.values()) > 0, outcomes


# Key 287529 at position 5: the accept uniform is exactly fl32(1 / 11) / 1.5 (found by a search over
# keys), so a uniform row over 11 tokens and q = 1.5 at the draft put p / q exactly on u.
TIE_KEY, TIE_POSITION, TIE_VOCAB, TIE_Q = 287529, 5, 11, 1.5


def test_a_ratio_equal_to_the_uniform_accepts():
    params = RowParams(1.0, 0, 1.0, 0, (), (), rng_key=TIE_KEY)
    logits = torch.zeros(2, TIE_VOCAB)
    md = SamplingMetadata.build([params] * 2, [TIE_POSITION, TIE_POSITION + 1], [[], []], CPU)
    p = float(probabilities_batch(logits, md)[0, 4])
    assert Fraction(p) / Fraction(TIE_Q) == Fraction(rng.uniform(TIE_KEY, TIE_POSITION, rng.STREAM_ACCEPT))
    q = torch.full((1, TIE_VOCAB), TIE_Q)
    spec = SpecDecodeMetadata.build([[4]], [0], CPU, q[None])
    out = rejection_sample(logits, md, spec)[0].tolist()
    assert out[0] == 4 and out[1] != -1, out
    assert out == verify(logits, [4], params, [], 0, TIE_POSITION, q)
