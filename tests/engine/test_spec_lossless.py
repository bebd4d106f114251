"""Speculative decoding is lossless under greedy: spec-on tokens equal spec-off tokens."""

import random

import pytest

from refengine.engine.llm import LLM
from refengine.model.tiny import build_tiny_model
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig


def _prompt(i: int) -> list[int]:
    rng = random.Random(1000 + i)
    # Repeats give prompt lookup something to find.
    base = [rng.randrange(3, 300) for _ in range(4 + i % 5)]
    return (base * 3)[: 6 + 2 * i]


PROMPTS = [_prompt(i) for i in range(16)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model("qwen3", seed=3)


@pytest.fixture(scope="module")
def baseline(tiny):
    return [o.token_ids for o in LLM(tiny, num_blocks=256, block_size=4, max_model_len=128).generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("max_num_seqs", [1, 2, 4, 8])
def test_ngram_is_lossless(tiny, baseline, max_num_seqs):
    spec = SpeculativeConfig("ngram", 3, prompt_lookup_min=1, prompt_lookup_max=3)
    llm = LLM(tiny, num_blocks=256, block_size=4, max_model_len=128, max_num_seqs=max_num_seqs,
              speculative_config=spec, record_steps=True)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == baseline
    stats = llm.engine.core.scheduler.spec_decoding_stats
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens > 0  # not vacuous
    assert sum(r.num_accepted for o in outs for r in o.steps) == stats.num_accepted_tokens
