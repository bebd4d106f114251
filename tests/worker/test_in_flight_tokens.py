"""Sampled ids stay on the device between steps: the runner hands back an in-flight output, the next
step gathers its input ids from the previous step's sampled ids (the -1 placeholders), and the host
learns the ids one frame later. The same code runs on the CPU (here) and the GPU (tests/gpu)."""

import random

import pytest

from refengine.engine.llm import LLM
from refengine.model.tiny import build_tiny_model
from refengine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model("qwen3", seed=1)


def _prompts(n: int) -> list[list[int]]:
    return [[random.Random(i).randrange(3, 300) for _ in range(4 + 5 * i)] for i in range(n)]


def _params(n: int, **extra) -> list[SamplingParams]:
    # Greedy and seeded rows in the same steps.
    return [
        SamplingParams(temperature=0.0 if i % 2 else 0.9, seed=10 + i, max_tokens=14, ignore_eos=True, **extra)
        for i in range(n)
    ]


def _generate(tiny, params, *, async_scheduling: bool, prompts=None, **kwargs):
    llm = LLM(tiny, async_scheduling=async_scheduling, num_blocks=128, block_size=4, max_model_len=128, **kwargs)
    outputs = [o.token_ids for o in llm.generate(prompts or _prompts(len(params)), params)]
    return outputs, llm.engine.core.runner


@pytest.mark.parametrize("max_num_batched_tokens", [None, 9])
def test_in_flight_ids_feed_the_next_step_exactly(tiny, max_num_batched_tokens):
    """Async (depth 2) equals sync token for token, and both equal each request run alone (a batch of
    one, where every gather reads row 0), also with chunked prefill in the same steps; and the
    in-flight path ran: steps sent in flight, inputs gathered on the device."""
    kwargs = {} if max_num_batched_tokens is None else {"max_num_batched_tokens": max_num_batched_tokens}
    params = _params(6)
    sync, _ = _generate(tiny, params, async_scheduling=False, **kwargs)
    in_flight, runner = _generate(tiny, params, async_scheduling=True, max_num_seqs=4, **kwargs)
    alone = [
        _generate(tiny, [sp], async_scheduling=True, prompts=[prompt], **kwargs)[0][0]
        for sp, prompt in zip(params, _prompts(len(params)), strict=True)
    ]
    assert in_flight == sync == alone
    assert all(len(t) == 14 for t in sync)
    assert runner.num_in_flight_steps > 10
    assert runner.num_gathered_inputs > 10


@pytest.mark.parametrize(
    "host_bound",
    [
        SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True, bad_words_token_ids=[[7], [8, 9]]),
        SamplingParams(temperature=0.9, seed=3, max_tokens=14, ignore_eos=True, logprobs=2),
    ],
    ids=["bad_words", "logprobs"],
)
def test_host_bound_requests_read_back_and_stay_identical(tiny, host_bound):
    """bad_words and logprobs need the ids on the host: a step holding such a request reads back at once
    (no in-flight output), the others still go in flight, and the tokens do not change."""
    params = _params(3)
    params[1] = host_bound
    sync, _ = _generate(tiny, params, async_scheduling=False)
    in_flight, runner = _generate(tiny, params, async_scheduling=True)
    assert in_flight == sync
    assert runner.num_in_flight_steps == 0  # every step held the host-bound request
    _, runner = _generate(tiny, params[:1] + params[2:], async_scheduling=True)
    assert runner.num_in_flight_steps > 0
