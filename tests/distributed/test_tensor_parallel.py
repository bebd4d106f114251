"""Tensor parallelism on the CPU (gloo, spawned worker ranks, tiny-qwen3: 4 heads, 2 KV heads, so TP=2 is
its limit): the TP-invariant mode's bitwise logits across TP sizes, rank 0's sampled ids winning over a
drifting rank, and sizes the model cannot split refused."""

import dataclasses

import pytest
import torch

from refengine.distributed.parallel_state import TensorParallelConfigError
from refengine.engine.llm import LLM
from refengine.oracle.prompts import token_prompts
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig

PROMPTS = [list(p) for p in token_prompts(320, 2, seed=0)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)


class LogitsTap:
    """Around the engine core's runner: rank 0's float32 logits of every step, as sample_tokens gets them."""

    def __init__(self, driven, model_runner) -> None:
        self.driven, self.model_runner, self.logits = driven, model_runner, []

    def execute_model(self, so) -> None:
        self.driven.execute_model(so)
        executed = self.model_runner._executed
        if executed is not None and executed.logits.numel():
            self.logits.append(executed.logits.clone())

    def sample_tokens(self, draft_overrides=None, grammar_output=None):
        return self.driven.sample_tokens(draft_overrides, grammar_output)

    def take_draft_token_ids(self):
        return self.driven.take_draft_token_ids()


def run(tp: int, **kwargs) -> tuple[list[list[int]], list[torch.Tensor]]:
    llm = LLM("tiny-qwen3", max_num_seqs=2, block_size=4, tensor_parallel_size=tp, **kwargs)
    tap = llm.engine.core.runner = LogitsTap(llm.engine.core.runner, llm.engine.runner)
    try:
        outs = llm.generate(PROMPTS, GREEDY)
    finally:
        llm.engine.core.shutdown()
    return [o.token_ids for o in outs], tap.logits


@pytest.fixture(scope="module")
def tp1_invariant():
    return run(1, tp_invariant=True)


def test_tp_invariant_logits_are_bitwise_equal_at_tp1_and_tp2(tp1_invariant):
    tokens1, logits1 = tp1_invariant
    tokens2, logits2 = run(2, tp_invariant=True)
    assert tokens2 == tokens1
    assert len(logits2) == len(logits1) > 1
    assert all(a.dtype == torch.float32 and torch.equal(a, b) for a, b in zip(logits1, logits2, strict=True))


def test_a_drifting_rank_does_not_change_the_output(tp1_invariant):
    """Rank 1 alone favours token 1 in every logits row (skew_logits_on_rank), under async scheduling with
    EAGLE at depth 2 (vllm-ascend#11215's setting): rank 0's sampled ids win on every rank, so the tokens
    are TP=1's."""
    tokens1, _ = tp1_invariant
    spec = SpeculativeConfig("eagle", 3)
    skewed, _ = run(2, tp_invariant=True, skew_logits_on_rank=1, speculative_config=spec, async_scheduling=True)
    assert skewed == tokens1
    assert any(1 not in row for row in skewed)  # the skew itself did not make the output


@pytest.mark.parametrize("kwargs, message", [
    ({"tensor_parallel_size": 3}, "tensor_parallel_size 3 does not divide the model's 4 attention heads"),
    ({"tensor_parallel_size": 4}, "tensor_parallel_size 4 does not divide the model's 2 KV heads"),
    ({"tp_invariant": True, "numerics": "fast"}, "tp_invariant is an option of batch_invariant numerics"),
])
def test_sizes_the_model_cannot_split_are_refused(kwargs, message):
    with pytest.raises((TensorParallelConfigError, ValueError), match=message):
        LLM("tiny-qwen3", **kwargs)


def test_the_tensor_parallel_model_is_loaded_by_name_on_every_rank(tiny_model):
    with pytest.raises(ValueError, match="needs the model by name or path"):
        LLM(dataclasses.replace(tiny_model), tensor_parallel_size=2)
