"""Speculative decoding on SmolLM2 (the embedded model): the self-draft accepts drafts for real, and
every method is lossless at c = 1 and 4. The full method matrix is slow (minutes of CPU); the
self-draft check runs by default."""

import pytest

from refengine.engine.llm import LLM
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig

pytestmark = pytest.mark.model

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5, 6,", "Once upon a time"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
ENGINE = dict(num_blocks=64, block_size=16, max_model_len=128)


@pytest.fixture(scope="module")
def baseline(smollm2):
    return [o.token_ids for o in LLM(smollm2, **ENGINE, max_num_seqs=4).generate(PROMPTS, GREEDY)]


def test_self_draft_accepts_drafts(smollm2, baseline):
    spec = SpeculativeConfig("draft_model", 4, num_draft_layers=8)
    llm = LLM(smollm2, **ENGINE, max_num_seqs=4, speculative_config=spec)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baseline
    stats = llm.engine.core.scheduler.spec_decoding_stats
    assert stats.num_accepted_tokens > 0, stats


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec",
    [
        SpeculativeConfig("ngram", 3),
        SpeculativeConfig("draft_model", 3, num_draft_layers=8),
        SpeculativeConfig("eagle", 3),
        SpeculativeConfig("eagle3", 3),
        SpeculativeConfig("mtp", 3),
        SpeculativeConfig("dflash", 3),
    ],
    ids=lambda spec: spec.method,
)
def test_every_method_is_lossless(smollm2, baseline, spec):
    for max_num_seqs in (1, 4):
        llm = LLM(smollm2, **ENGINE, max_num_seqs=max_num_seqs, speculative_config=spec)
        tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        assert tokens == baseline, f"{spec.method} at max_num_seqs={max_num_seqs}"
