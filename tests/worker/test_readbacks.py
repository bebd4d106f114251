"""Host reads of device results, counted where they happen. Under async scheduling a step without
logprobs or bad words reads nothing back in the runner: its ids (and, for EAGLE/EAGLE3/MTP and DFlash,
its drafts and accepted counts) go in flight, the next step is launched from them on the device, and the
host learns them one frame later (zero-bubble speculative decoding). Under sync scheduling the scheduler
needs the drafts before the next step: one read per drafting step, drafts and verified ids in one copy."""

import random

import pytest

from refengine.engine.llm import LLM
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig

PROMPTS = [[random.Random(i).randrange(3, 300) for _ in range(6 + 5 * i)] for i in range(4)]


def _params(**extra) -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.0 if i % 2 else 0.9, seed=i, max_tokens=12, ignore_eos=True, **extra)
        for i in range(len(PROMPTS))
    ]


def _runner(tiny, params, **kwargs):
    llm = LLM(tiny, num_blocks=128, block_size=4, max_model_len=128, **kwargs)
    llm.generate(PROMPTS, params)
    return llm.engine.runner


def test_the_common_async_path_reads_nothing_back(tiny4):
    runner = _runner(tiny4, _params(), async_scheduling=True)
    assert runner.num_in_flight_steps > 10
    assert runner.num_readback_steps == 0
    # The count bites: a request that wants logprobs needs its ids on the host at once.
    params = _params()
    params[0] = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
    assert _runner(tiny4, params, async_scheduling=True).num_readback_steps > 5


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("method", ["mtp", "eagle3", "dflash"])
def test_a_padded_spec_step_waits_for_the_device_once_under_sync_never_under_async(tiny4, method, async_scheduling):
    runner = _runner(
        tiny4, _params(), speculative_config=SpeculativeConfig(method, 3), async_scheduling=async_scheduling
    )
    drafter = runner.drafter
    assert drafter.num_eager_steps > 5  # steps that drafted
    # The drafter reads nothing back itself: its drafts come with the verified ids, one copy per step.
    assert drafter.num_readbacks == 0
    if async_scheduling:
        # Every drafting step went in flight, and the steps after it took their ids and drafts from the
        # device (the count bites: sync gathers none).
        assert runner.num_readback_steps == 0
        assert runner.num_in_flight_steps >= drafter.num_eager_steps - 1
        assert runner.num_gathered_inputs > drafter.num_eager_steps
    else:
        assert runner.num_readback_steps == drafter.num_eager_steps
        assert runner.num_gathered_inputs == 0

