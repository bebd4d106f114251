"""The chunked-prefill variant at high c: all c requests run at once (no LOW-CONCURRENCY) and every prompt
is still prefilled over >= 2 steps (the variant bites). On the H200, random:qwen3-0.6b at c = 32 with 12
output tokens peaked at 31 of 32 in every chunked arm: a fixed budget prefilled the later prompts so slowly
that the first request finished before the last was admitted."""

import pytest

from refengine.oracle.arms import Arm
from refengine.oracle.prompts import token_prompts
from refengine.oracle.run import Workload, run_arm
from refengine.oracle.runner import resolve_model

C = 16


@pytest.fixture(scope="module")
def model():
    return resolve_model("tiny-qwen3")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("front", "method", "preempt"),
    [("sync", None, False), ("sync", "eagle", False), ("sync", "eagle", True), ("async-d2", "eagle", True)],
)
def test_chunked_arms_reach_c_and_chunk_every_prompt(model, front, method, preempt):
    prompts = tuple(map(tuple, token_prompts(model.config.vocab_size, C, seed=0)))
    # 3 output tokens: short enough that the first request is done within a few steps of its admission.
    workload = Workload(prompts, 3, C, 0.0, 0, 3)
    result = run_arm(model, Arm(front, method, True, preempt, False), workload, 4)
    assert result.counts.peak_concurrency == C  # not LOW-CONCURRENCY
    assert result.counts.num_chunked_prefills == C  # every prompt prefilled over >= 2 steps
