"""The engine on the embedded SmolLM2: one cheap identity check on the real model."""

import pytest

from refengine.engine.llm import LLM
from refengine.sampling_params import SamplingParams

pytestmark = pytest.mark.model


def test_smollm2_greedy_identity_alone_and_batched(smollm2):
    llm = LLM(smollm2, max_model_len=256, num_blocks=64)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    params = SamplingParams(temperature=0.0, max_tokens=12)
    batched = llm.generate(prompts, params)
    alone = [llm.generate([p], params)[0] for p in prompts]
    assert [o.token_ids for o in batched] == [o.token_ids for o in alone]
    assert "Paris" in batched[0].text
