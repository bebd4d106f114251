"""The runner refuses a SchedulerOutput that contradicts its own per-request state
(invariants 17, 18, 19 and 30 in docs/invariants.md), with a named error instead of a wrong forward."""

import pytest

from refengine.core.outputs import CachedRequestData, NewRequestData
from refengine.engine.arg_utils import EngineArgs
from refengine.engine.engine_args import build_engine
from refengine.engine.llm import LLM
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.worker.errors import RunnerInvariantError
from tests.core.harness import hand_built_output as step

PROMPT = (5, 6, 7, 8)


@pytest.fixture
def runner():
    engine = build_engine(EngineArgs(model="tiny-qwen3", num_blocks=16, max_model_len=64))
    yield engine.core.runner
    engine.core.shutdown()


def new_request(req_id: str = "a") -> NewRequestData:
    return NewRequestData(req_id, PROMPT, (), SamplingParams(max_tokens=8), 1, None, (0,), 0)


def test_a_step_past_the_known_tokens_is_refused(runner):
    """Invariant 19: six positions scheduled for a request whose runner knows four tokens."""
    with pytest.raises(RunnerInvariantError, match="knows only 4 tokens"):
        runner.execute_model(step(new=[new_request()], num_scheduled={"a": len(PROMPT) + 2}))


def test_a_cached_request_the_runner_does_not_hold_is_refused(runner):
    """Invariant 17: state is found by request id; an unknown id is an error, not another row's state."""
    with pytest.raises(RunnerInvariantError, match="has no runner state"):
        runner.execute_model(step(cached=[CachedRequestData("ghost", 4, (0,))], num_scheduled={"ghost": 1}))


def test_a_scheduler_count_behind_the_runner_is_refused(runner):
    """Invariant 18: the scheduler's count may run ahead of the runner's (async), never behind it."""
    runner.execute_model(step(new=[new_request()], num_scheduled={"a": len(PROMPT)}))
    runner.sample_tokens()
    with pytest.raises(RunnerInvariantError, match="behind the runner"):
        runner.execute_model(step(cached=[CachedRequestData("a", 2, (0,))], num_scheduled={"a": 1}))


def test_a_cached_request_whose_blocks_shrank_is_refused(runner):
    """Invariant 17: a held request's blocks only grow; fewer would be another request's table."""
    runner.execute_model(
        step(
            new=[NewRequestData("a", PROMPT, (), SamplingParams(max_tokens=8), 1, None, (0, 1), 0)],
            num_scheduled={"a": len(PROMPT)},
        )
    )
    runner.sample_tokens()
    with pytest.raises(RunnerInvariantError, match="1 blocks sent, the runner holds 2"):
        runner.execute_model(step(cached=[CachedRequestData("a", 4, (0,))], num_scheduled={"a": 1}))


def test_a_new_request_the_runner_already_holds_is_refused(runner):
    """Invariant 17: one batch row per held request; a second admission without a finish or preemption
    in between would leave two rows for one id."""
    runner.execute_model(step(new=[new_request()], num_scheduled={"a": len(PROMPT)}))
    runner.sample_tokens()
    with pytest.raises(RunnerInvariantError, match="already in the batch"):
        runner.execute_model(step(new=[new_request()], num_scheduled={"a": len(PROMPT)}))


class _DropsADraftRow:
    """A padded drafter that loses a request's row: its drafts would land on the wrong requests."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.capture_layers = inner.capture_layers
        self.random_init = False

    def propose(self, batch):
        return self.inner.propose(batch)[1:]

    def commit(self, requests, rows):
        return self.inner.commit(requests, rows)

    def remove(self, req_ids):
        self.inner.remove(req_ids)


def test_a_padded_drafter_missing_a_row_is_refused(tiny4):
    """Invariant 30: one row of drafts per verified request, in order, read back with its tokens."""
    llm = LLM(
        tiny4,
        num_blocks=64,
        block_size=4,
        max_model_len=64,
        async_scheduling=False,
        speculative_config=SpeculativeConfig("mtp", 2),
    )
    llm.engine.runner.drafter = _DropsADraftRow(llm.engine.runner.drafter)
    with pytest.raises(RunnerInvariantError, match="rows of drafts for 2 verified requests"):
        llm.generate(
            [[5, 6, 7], [8, 9, 10, 11]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        )
