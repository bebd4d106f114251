"""The prefix cache inside the whole engine: shared prefixes, whole repeated prompts, chunked prefill,
a pool small enough to preempt and a structured-output request, with the cache on and off: the same
tokens (seeded) for an Eagle-type drafter at depth 1 and 2, and ngram (sync)."""

import pytest

from refengine.engine.llm import LLM
from refengine.sampling_params import SamplingParams, StructuredOutputsParams
from refengine.spec_decode.config import SpeculativeConfig

PREFIX = [(7 * i) % 200 + 3 for i in range(40)]
PROMPTS = [PREFIX + [50 + i, 60 + i, 70] for i in range(4)] * 2


def _params(temperature: float) -> list[SamplingParams]:
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=10, ignore_eos=True) for i in range(len(PROMPTS))]
    params[5] = SamplingParams(temperature=temperature, seed=5, max_tokens=24, structured_outputs=StructuredOutputsParams(regex="[a-c]{3,8}"))
    return params


def _run(cache: bool, spec: SpeculativeConfig | None, batch_queue: bool, temperature: float):
    llm = LLM(
        "tiny-qwen3", speculative_config=spec, enable_prefix_caching=cache, block_size=4, max_num_seqs=3,
        max_model_len=96, num_blocks=30, long_prefill_token_threshold=12, max_num_batched_tokens=64,
    )
    outs = llm.generate(PROMPTS, _params(temperature), batch_queue=batch_queue)
    scheduler = llm.engine.core.scheduler
    llm.engine.core.shutdown()
    return [o.token_ids for o in outs], scheduler


@pytest.mark.parametrize(
    "method, batch_queue", [("eagle", False), ("eagle", True), ("ngram", False)], ids=["eagle-d1", "eagle-d2", "ngram-sync"]
)
def test_cache_on_equals_cache_off(method, batch_queue):
    """Seeded (greedy runs in the oracle's prefix-cache arms, tests/oracle/test_prefix_cache_oracle.py)."""
    spec = SpeculativeConfig(method, 2)
    off, _ = _run(False, spec, batch_queue, 0.8)
    on, scheduler = _run(True, spec, batch_queue, 0.8)
    assert on == off
    kv = scheduler.kv_cache_manager
    assert kv.prefix_cache_stats.hits > 0 and scheduler.num_preemptions > 0
    assert kv.num_free_blocks == kv.block_pool.num_blocks  # every reference dropped
