"""Zero-bubble speculative decoding (invariants 48 and 49 in docs/invariants.md): under async scheduling
an Eagle-type step is launched from the previous step's device results, before its accepted counts
reach the host. The device moves the step back by the drafts the host over-counted, and the host checks
one frame late that it did so exactly; the blocks hold the optimistic count and the drafter's lookahead
before the launch. The same code runs on the CPU (here) and the GPU (tests/gpu)."""

import random

import pytest

from refengine.core.outputs import NewRequestData
from refengine.engine.arg_utils import EngineArgs
from refengine.engine.engine_args import build_engine
from refengine.engine.llm import LLM
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.worker.errors import RunnerInvariantError
from tests.core.harness import hand_built_output as step

K = 3
PROMPTS = [[random.Random(i).randrange(3, 300) for _ in range(5 + 4 * i)] for i in range(4)]
# Greedy and seeded rows at temperature > 0, with k >= 2 drafts in the same steps.
PARAMS = [
    SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, max_tokens=14 + i, ignore_eos=True) for i in range(4)
]


def _generate(tiny4, method: str, async_scheduling: bool):
    llm = LLM(
        tiny4,
        num_blocks=96,
        block_size=4,
        max_model_len=64,
        speculative_config=SpeculativeConfig(method, K),
        async_scheduling=async_scheduling,
    )
    return [o.token_ids for o in llm.generate(PROMPTS, PARAMS)], llm


@pytest.mark.parametrize("method", ["mtp", "eagle3", "dflash"])
def test_async_spec_steps_launch_from_the_device_and_equal_sync(tiny4, method):
    """Async equals sync token for token, while no step waited for its results: each spec step was
    launched from the device's drafts and counts, and moved back by its predecessor's rejections."""
    sync_ids, _ = _generate(tiny4, method, async_scheduling=False)
    async_ids, llm = _generate(tiny4, method, async_scheduling=True)
    assert async_ids == sync_ids
    runner = llm.engine.runner
    stats = llm.engine.core.scheduler.spec_decoding_stats
    assert runner.num_readback_steps == 0
    # The variants ran: launches corrected by a frame in flight, and rejections for them to correct.
    assert runner.num_corrected_launches > 10
    assert stats.num_accepted_tokens < stats.num_draft_tokens


def _runner(tiny4):
    return build_engine(
        EngineArgs(
            model=tiny4, num_blocks=16, block_size=4, max_model_len=32, speculative_config=SpeculativeConfig("mtp", K)
        )
    ).runner


def _new(prompt_len: int, block_ids: tuple[int, ...]) -> NewRequestData:
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    return NewRequestData("a", tuple(range(3, 3 + prompt_len)), (), params, 1, None, block_ids, 0)


def test_a_step_whose_lookahead_passes_its_blocks_is_refused(tiny4):
    """Invariant 49 at a block boundary: a 5-token prompt and 3 lookahead slots fill two blocks of 4
    exactly and run; a 6-token prompt needs one slot more, in a block it does not have (trtllm#16280)."""
    runner = _runner(tiny4)
    assert runner.num_lookahead_slots == K
    runner.execute_model(step(new=[_new(5, (0, 1))], num_scheduled={"a": 5}))
    runner.sample_tokens()
    runner = _runner(tiny4)
    with pytest.raises(RunnerInvariantError, match=r"6 positions planned and 3 lookahead slots, but its 2 blocks hold 8"):
        runner.execute_model(step(new=[_new(6, (0, 1))], num_scheduled={"a": 6}))
