"""AsyncLLM over a tiny model: concurrent streams, aborts that free KV, and honest death."""

import asyncio

import pytest

from refengine.engine.arg_utils import EngineArgs
from refengine.engine.async_llm import AsyncLLM
from refengine.engine.llm import LLM
from refengine.engine.outputs import EngineDeadError, GenerationRequest
from refengine.model.tiny import build_tiny_model
from refengine.sampling_params import SamplingParams

PROMPTS = [[7 + i, 40 + 3 * i, 11, 90 - i, 5 * i + 1] for i in range(8)]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model("qwen3", seed=2)


def args(tiny, **kw):
    kw.setdefault("num_blocks", 128)
    kw.setdefault("block_size", 4)
    kw.setdefault("max_model_len", 256)
    return EngineArgs(model=tiny, **kw)


async def collect(llm: AsyncLLM, req_id: str, prompt: list[int], params: SamplingParams) -> list[int]:
    tokens: list[int] = []
    async for delta in llm.generate(GenerationRequest(req_id, prompt, params)):
        tokens += delta.token_ids
    return tokens


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_concurrent_streams_equal_offline_generate(tiny, async_scheduling):
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    offline = [o.token_ids for o in LLM(tiny, num_blocks=128, block_size=4, max_model_len=256).generate(PROMPTS, params)]
    llm = AsyncLLM(args(tiny, async_scheduling=async_scheduling))

    async def main():
        return await asyncio.gather(*(collect(llm, f"r{i}", p, params) for i, p in enumerate(PROMPTS)))

    try:
        assert asyncio.run(main()) == offline
        assert llm.engine_info.async_scheduling is async_scheduling
    finally:
        llm.shutdown()


def test_abandoned_streams_free_their_blocks(tiny):
    llm = AsyncLLM(args(tiny))
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def abandon(i: int) -> None:
        async for _ in llm.generate(GenerationRequest(f"a{i}", PROMPTS[i], params)):
            break  # leave after the first delta, as a disconnecting client does

    async def main():
        await asyncio.gather(*(abandon(i) for i in range(8)))
        for _ in range(200):
            if llm.stats().num_free_blocks == 128 and llm.stats().num_requests_running == 0:
                return
            await asyncio.sleep(0.01)

    try:
        asyncio.run(main())
        assert llm.stats().num_free_blocks == 128
        # and it still serves
        assert len(asyncio.run(collect(llm, "after", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=3)))) >= 1
    finally:
        llm.shutdown()


def test_fault_marks_the_engine_dead(tiny):
    llm = AsyncLLM(args(tiny, fault_after_steps=3))
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    try:
        with pytest.raises(EngineDeadError, match="injected fault"):
            asyncio.run(collect(llm, "x", PROMPTS[0], params))
        assert "injected fault" in llm.dead_reason
        with pytest.raises(EngineDeadError):
            asyncio.run(collect(llm, "y", PROMPTS[1], params))
    finally:
        llm.shutdown()


def test_logprobs_one_per_token_and_greedy_picks_the_top(tiny):
    from refengine.spec_decode.config import SpeculativeConfig

    llm = AsyncLLM(args(tiny, speculative_config=SpeculativeConfig("ngram", 3), async_scheduling=False))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompt = PROMPTS[0] * 3  # repeats, so prompt lookup drafts and deltas carry several tokens

    async def main():
        return [d async for d in llm.generate(GenerationRequest("lp", prompt, params, logprobs=3))]

    try:
        deltas = asyncio.run(main())
    finally:
        llm.shutdown()
    assert sum(len(d.token_ids) for d in deltas) == 12
    for d in deltas:
        assert len(d.logprobs) == len(d.token_ids)
        for token, lp in zip(d.token_ids, d.logprobs, strict=True):
            assert lp.token_id == token and lp.logprob <= 0.0 and len(lp.top) == 3
            assert lp.top[0][0] == token and lp.top[0][1] == lp.logprob  # greedy emits the argmax


def test_each_request_finishes_with_its_own_draft_counts(tiny):
    """Two requests drafted at once (ngram): each one's finishing delta carries its own drafts and
    acceptances, only that one does, and together they are the engine's counters (what /metrics exports)."""
    from refengine.spec_decode.config import SpeculativeConfig

    llm = AsyncLLM(args(tiny, speculative_config=SpeculativeConfig("ngram", 3), async_scheduling=False))
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

    async def one(req_id: str, prompt: list[int]):
        return [d async for d in llm.generate(GenerationRequest(req_id, prompt, params))]

    async def main():
        return await asyncio.gather(one("a", PROMPTS[0] * 3), one("b", PROMPTS[1] * 2 + PROMPTS[2]))

    try:
        streams = asyncio.run(main())
        totals = llm.stats()
    finally:
        llm.shutdown()
    finals = []
    for deltas in streams:
        assert all(d.spec_decoding_stats is None for d in deltas[:-1])
        finals.append(deltas[-1].spec_decoding_stats)
    assert all(s is not None and s.num_drafts > 0 for s in finals)
    assert sum(s.num_drafts for s in finals) == totals.spec_num_drafts
    assert sum(s.num_draft_tokens for s in finals) == totals.spec_num_draft_tokens
    assert sum(s.num_accepted_tokens for s in finals) == totals.spec_num_accepted_tokens > 0
    width = len(totals.spec_num_accepted_tokens_per_pos)
    assert [sum(s.num_accepted_tokens_per_pos[i] for s in finals if i < len(s.num_accepted_tokens_per_pos))
            for i in range(width)] == totals.spec_num_accepted_tokens_per_pos
