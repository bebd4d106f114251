"""The pinned TP=2 slice of the oracle in CI (tiny-qwen3, gloo, one spawned worker rank per engine): eagle
sync against async at depth 1 and 2, and ngram, at c = 2 with forced preemption biting, each IDENTICAL to
the TP=2 baseline and its sync twin. The full TP=2 matrix is `make oracle-tp`."""

import pytest

from refengine.oracle.arms import Arm
from refengine.oracle.judge import judge
from refengine.oracle.prompts import token_prompts
from refengine.oracle.run import TensorParallel, Workload, run_arm
from refengine.oracle.runner import resolve_model

BLOCK_SIZE = 4
TP2 = TensorParallel("tiny-qwen3", 2)


@pytest.fixture(scope="module")
def model():
    return resolve_model("tiny-qwen3")


@pytest.fixture(scope="module")
def workload(model):
    prompts = tuple(map(tuple, token_prompts(model.config.vocab_size, 2, seed=0)))
    return Workload(prompts, 8, 2, 0.0, 0, 3)


@pytest.fixture(scope="module")
def baseline(model, workload):
    return run_arm(model, Arm("sync", None, False, False, False), workload, BLOCK_SIZE, tensor_parallel=TP2)


@pytest.mark.parametrize("method, fronts", [("eagle", ("sync", "async-d1", "async-d2")), ("ngram", ("sync",))])
def test_tp2_sync_and_async_arms_are_identical_with_preemption(model, workload, baseline, method, fronts):
    results = {
        front: run_arm(model, Arm(front, method, False, True, False), workload, BLOCK_SIZE, tensor_parallel=TP2)
        for front in fronts
    }
    for front, result in results.items():
        assert result.counts.num_preemptions > 0, front
        verdict = judge(result, baseline, results["sync"] if front != "sync" else None)
        assert verdict.label == "IDENTICAL", (front, verdict)
