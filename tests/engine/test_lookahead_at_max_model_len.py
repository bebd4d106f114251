"""A request that reaches max_model_len under async scheduling at depth 1 with a drafter (found by
tests/engine/test_engine_properties.py): the runner's optimistic count, every draft in flight accepted,
runs past max_model_len by up to the drafter's lookahead, so its token row must hold that many more
(the runner once raised mid-request, "could not broadcast input array from shape (2,) into shape (1,)")."""

import pytest

from refengine.engine.llm import LLM
from refengine.model.tiny import build_tiny_model
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig


@pytest.mark.parametrize("method", ["eagle", "dflash"])
def test_a_request_reaches_max_model_len_at_depth_1_with_drafts_in_flight(method):
    tiny_model = build_tiny_model("qwen3", seed=0)
    prompt, max_model_len = [9, 226, 213, 174, 79, 90], 10
    params = SamplingParams(temperature=0.0, max_tokens=max_model_len - len(prompt), ignore_eos=True)
    off = LLM(tiny_model, max_model_len=max_model_len, async_scheduling=False)
    expected = off.generate([prompt], params)[0].token_ids
    llm = LLM(
        tiny_model, speculative_config=SpeculativeConfig(method, 1), async_scheduling=True, block_size=2,
        max_model_len=max_model_len, num_blocks=6, enable_prefix_caching=False,
    )  # fmt: skip
    assert llm.generate([prompt], params, batch_queue=False)[0].token_ids == expected
    assert len(expected) == max_model_len - len(prompt)
    assert llm.engine.core.scheduler.spec_decoding_stats.num_draft_tokens > 0
