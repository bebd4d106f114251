"""Adaptive verification in the engine (tiny-qwen3 on the CPU, EAGLE k = 3 with SYNTHETIC acceptance, so
that acceptance is known): the cost table is measured at start-up with the engine's step, and the K the
policy chooses is the K the runner verifies, sync and async at depth 1 and 2. The choices are made
against a given table (the measured one follows the CPU's load); that tokens are unchanged is the
oracle's part (tests/oracle, the adaptive arms).

Invariant numbers refer to docs/invariants.md.
"""

import pytest

from refengine.engine.llm import LLM
from refengine.model.loader import load_model
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.adaptive_verification import AdaptiveVerification, VerifyCostTable
from refengine.spec_decode.config import SpeculativeConfig

K = 3
FRONTS = {"sync": (False, False), "async depth 1": (True, False), "async depth 2": (True, True)}


@pytest.fixture(scope="module")
def tiny_qwen3():
    return load_model("tiny-qwen3")


ADAPTIVE = SpeculativeConfig("eagle", K, enable_adaptive_verification=True)
# Each draft costs a fifth of a step per request: a slot pays when it survives more than about 1/6.
TABLE = VerifyCostTable.monotone([1, 4], [[1 + 0.2 * j for j in range(K + 1)] for _ in (1, 4)])


def run(model, front: str, rate: float) -> tuple[AdaptiveVerification, list[tuple[int, ...]]]:
    async_scheduling, batch_queue = FRONTS[front]
    llm = LLM(model, speculative_config=ADAPTIVE, verify_cost_table=TABLE, async_scheduling=async_scheduling,
              synthetic_acceptance_rate=rate, max_model_len=64, max_num_seqs=4, record_steps=True)  # fmt: skip
    outs = llm.generate([[5 + i, 6, 7, 8] for i in range(4)], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
                        batch_queue=batch_queue)  # fmt: skip
    return llm.engine.core.scheduler.verify_policy, [r.draft_token_ids for o in outs for r in o.steps]


@pytest.mark.parametrize("front", FRONTS)
def test_adaptive_k_is_honoured_and_never_exceeds_k(tiny_qwen3, front):
    """Nothing accepted: the policy chooses K = 0 (a probe of 1 now and then) and the runner verifies no
    more; everything accepted: K = k. Invariant 60 (0 <= K <= k) is checked on every choice."""
    policy, fed = run(tiny_qwen3, front, 0.0)
    # The first steps verify all k (nothing seen yet: survival 1), then K = 0: the variant happened.
    assert policy.num_chosen[0] > 4 * policy.num_chosen[K] > 0, policy.num_chosen
    assert honoured(policy, fed)
    policy, fed = run(tiny_qwen3, front, 1.0)
    assert policy.num_chosen[K] > sum(policy.num_chosen[:K]), policy.num_chosen
    assert sum(len(d) == K for d in fed) > 0 and honoured(policy, fed)


def honoured(policy: AdaptiveVerification, fed: list[tuple[int, ...]]) -> bool:
    """No request verified more drafts than chosen: the runner's fed drafts of each length, at most the
    choices of that K (a choice can go unfed: a request that the frame in flight finishes)."""
    return all(sum(len(d) == n for d in fed) <= policy.num_chosen[n] for n in range(1, K + 1)) and all(len(d) <= K for d in fed)


def test_the_cost_table_is_measured_at_start_up(tiny_qwen3):
    """Without a given table: one row per batch size 1, 2, 4 (max_num_seqs), K = 0..k, every point timed."""
    llm = LLM(tiny_qwen3, speculative_config=ADAPTIVE, max_model_len=32, max_num_seqs=4)
    measured = llm.engine.core.scheduler.verify_policy.table
    assert measured.batch_sizes == (1, 2, 4) and all(len(row) == K + 1 for row in measured.seconds)
    assert all(s > 0 for row in measured.seconds for s in row)
    assert all(a <= b for row in measured.seconds for a, b in zip(row, row[1:], strict=False))


def test_off_by_default_and_refused_where_it_cannot_hold(tiny_qwen3):
    """Refused: under tensor parallelism, a table without the flag, a table for another k."""
    llm = LLM(tiny_qwen3, speculative_config=SpeculativeConfig("eagle", K), max_model_len=32, max_num_seqs=2)
    assert llm.engine.core.scheduler.verify_policy is None
    with pytest.raises(ValueError, match="tensor_parallel_size 1"):
        # A given table: without the refusal the engine would start (M469), not hang measuring one on rank 0.
        LLM("tiny-qwen3", speculative_config=ADAPTIVE, verify_cost_table=TABLE, tensor_parallel_size=2, max_model_len=32)
    with pytest.raises(ValueError, match="set enable_adaptive_verification"):
        LLM(tiny_qwen3, speculative_config=SpeculativeConfig("eagle", K), verify_cost_table=TABLE, max_model_len=32)
    with pytest.raises(ValueError, match=f"a verify-cost table for k=1 in an engine of k={K}"):
        LLM(tiny_qwen3, speculative_config=ADAPTIVE, verify_cost_table=VerifyCostTable.monotone([1], [[1.0, 1.2]]),
            max_model_len=32)  # fmt: skip
