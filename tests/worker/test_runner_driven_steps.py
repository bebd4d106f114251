"""The runner driven step by step with hand-built SchedulerOutputs on tiny-qwen3, so every step's
batch is known: exact sampled ids, exact counters (steps, eager steps, steps in flight, gathered
inputs), the host patching of in-flight ids one step late, prefill chunks beside decodes, drafts
filled, overridden and recorded, and the named errors for calls out of order and impossible batches
(invariant numbers refer to docs/invariants.md).

Greedy references (tiny-qwen3, seed 1): [5, 6, 7, 8] -> 92 63 34 266; [9..14] -> 107 213 151."""

import numpy as np
import pytest
import torch

from refengine.core.outputs import (
    CachedRequestData,
    GrammarOutput,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
    StepRecord,
)
from refengine.engine.arg_utils import EngineArgs
from refengine.engine.engine_args import build_engine
from refengine.model.tiny import build_tiny_model
from refengine.sample.metadata import RowParams
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.worker.async_output import AsyncModelRunnerOutput, resolve
from refengine.worker.errors import RunnerInvariantError
from refengine.worker.fault_injection import InjectedFault
from refengine.worker.model_runner import ModelRunner
from refengine.worker.request_state import CachedRequestState
from refengine.worker.runner import Runner
from refengine.worker.verify_step import token_logprobs
from tests.core.harness import hand_built_output as step

A_PROMPT = (5, 6, 7, 8)
A_GREEDY = [92, 63, 34, 266]
B_PROMPT = (9, 10, 11, 12, 13, 14)
B_GREEDY = [107, 213, 151]
BLOCKS = {"a": (0, 1, 2, 3), "b": (4, 5, 6, 7)}  # 16 positions each at block_size 4


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model("qwen3", seed=1)


def make_engine(tiny, **kwargs):
    return build_engine(EngineArgs(model=tiny, num_blocks=16, block_size=4, max_model_len=32, **kwargs))


def make_runner(tiny, **kwargs) -> ModelRunner:
    """The ModelRunner itself, under any test wrapper the engine puts around it."""
    return make_engine(tiny, **kwargs).runner


def new(req_id: str, prompt=A_PROMPT, output=(), **params) -> NewRequestData:
    sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, **params)
    return NewRequestData(req_id, tuple(prompt), tuple(output), sp, 1, None, BLOCKS[req_id], 0)


def cached(req_id: str, num_computed: int) -> CachedRequestData:
    return CachedRequestData(req_id, num_computed, BLOCKS[req_id])


def history(runner: ModelRunner, req_id: str) -> list[int]:
    """A request's tokens as the runner keeps them, once: in its batch row (-1: in flight)."""
    batch = runner.input_batch
    return batch.history(batch.req_id_to_index[req_id], runner.requests[req_id].num_tokens).tolist()


def run(runner: Runner, so: SchedulerOutput, draft_overrides=None):
    runner.execute_model(so)
    return runner.sample_tokens(draft_overrides)


def chunked_b_beside_a(**a_params):
    """b's 6-token prompt in three chunks of 2 (listed first, so a row after a chunk must still be
    handled), beside a's prefill then decodes: (SchedulerOutput, expected sampled ids) per step."""
    return [
        (
            step(new=[new("b", B_PROMPT), new("a", **a_params)], num_scheduled={"b": 2, "a": 4}),
            [[], A_GREEDY[:1]],
        ),
        (step(cached=[cached("b", 2), cached("a", 4)], num_scheduled={"b": 2, "a": 1}), [[], A_GREEDY[1:2]]),
        (
            step(cached=[cached("b", 4), cached("a", 5)], num_scheduled={"b": 2, "a": 1}),
            [B_GREEDY[:1], A_GREEDY[2:3]],
        ),
        (
            step(cached=[cached("b", 6), cached("a", 6)], num_scheduled={"b": 1, "a": 1}),
            [B_GREEDY[1:2], A_GREEDY[3:4]],
        ),
    ]


def test_in_flight_steps_count_and_patch_exactly(tiny):
    """No drafts, logprobs or bad words: every step goes in flight; the next step gathers a's (and
    later b's) input on the device; the host ids are patched one step late, when the step after has
    been launched."""
    runner = make_runner(tiny)
    assert runner.last_sampled_frame() is None  # nothing sampled yet
    outputs = []
    for so, _ in chunked_b_beside_a():
        out = run(runner, so)
        assert isinstance(out, AsyncModelRunnerOutput)
        outputs.append(out)
    assert [o.get_output().sampled_token_ids for o in outputs] == [e for _, e in chunked_b_beside_a()]
    assert [o.get_output().req_ids for o in outputs] == [["b", "a"]] * 4
    assert runner.num_steps == runner.num_eager_steps == runner.num_in_flight_steps == 4
    assert runner.num_gathered_inputs == 4  # a in steps 2, 3, 4; b in step 4
    assert runner.num_overlapped_launches == 0  # CPU copies land at once: no launch overlaps one
    assert runner.num_graph_steps == 0
    assert runner.num_corrected_launches == 0  # no step fed drafts: no launch moved back
    # Steps 1 and 2 landed (patched at the launch of steps 3 and 4); steps 3 and 4 are still in flight.
    assert history(runner, "a") == [*A_PROMPT, *A_GREEDY[:2], -1, -1]
    assert history(runner, "b") == [*B_PROMPT, -1, -1]
    assert [runner.requests[r].num_computed_tokens for r in "ab"] == [7, 7]


def test_read_back_steps_give_the_same_ids_and_logprobs(tiny):
    """A request that wants logprobs reads every step back on the host: the same ids, one logprob
    entry per sampled token (its own id, no top list for logprobs=0), and no step in flight."""
    runner = make_runner(tiny)
    for so, expected in chunked_b_beside_a(logprobs=0):
        out = run(runner, so)
        assert isinstance(out, ModelRunnerOutput)
        assert out.req_ids == ["b", "a"]
        assert out.sampled_token_ids == expected
        assert [(lp.token_id, lp.top) for lp in out.logprobs["a"]] == [(expected[1][0], [])]
        assert "b" not in out.logprobs
    assert runner.num_in_flight_steps == runner.num_gathered_inputs == 0
    assert runner.num_steps == runner.num_eager_steps == runner.num_readback_steps == 4
    assert history(runner, "a") == [*A_PROMPT, *A_GREEDY]
    assert [runner.requests[r].num_computed_tokens for r in "ab"] == [7, 7]


@pytest.mark.parametrize("logprobs", [None, 0], ids=["in_flight", "read_back"])
def test_a_placeholder_without_a_runner_draft_is_rejected(tiny, logprobs):
    """The scheduler ships a -1 placeholder the runner has no draft for (none proposed): it is fed as
    token 0 and always rejected, so the step emits exactly the greedy token."""
    runner = make_runner(tiny)
    resolve(run(runner, step(new=[new("a", logprobs=logprobs)], num_scheduled={"a": 4})))
    out = run(runner, step(cached=[cached("a", 4)], num_scheduled={"a": 2}, spec={"a": [-1]}))
    # Two rows sampled stay on the device too; logprobs need them on the host at once.
    assert isinstance(out, ModelRunnerOutput) == (logprobs is not None)
    assert resolve(out).sampled_token_ids == [A_GREEDY[1:2]]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (None, A_GREEDY[1:4]),  # both drafts equal the greedy targets: accepted, plus the bonus token
        ({"a": [63, -1]}, A_GREEDY[1:3]),  # the constraint branch padded the second draft: rejected there
        ({"other": [-1, -1]}, A_GREEDY[1:4]),  # an override for another request changes nothing here
    ],
)
def test_drafts_verify_against_overrides_and_record_what_was_fed(tiny, overrides, expected):
    # Recording is a wrapper around the runner (step_recorder.py): it is driven here, as the engine does.
    recorder = make_engine(tiny, record_steps=True).step_recorder
    resolve(run(recorder, step(new=[new("a")], num_scheduled={"a": 4})))
    out = run(recorder, step(cached=[cached("a", 4)], num_scheduled={"a": 3}, spec={"a": [63, 34]}), overrides)
    # Overrides are the deferred branch's: they come back read, the others in flight.
    assert isinstance(out, ModelRunnerOutput) == bool(overrides)
    assert resolve(out).sampled_token_ids == [expected]
    # The record keeps the fed drafts (not the override) at the position of the first draft.
    assert recorder.take_step_records("a") == [StepRecord(5, (63, 34), len(expected) - 1)]


def test_placeholders_are_filled_from_the_runners_own_drafts_by_position():
    """Under async the scheduler ships -1 placeholders; the runner fills position j from its pending
    drafts while it has one, keeps a real id the scheduler sent, and leaves -1 past its drafts."""
    state = CachedRequestState("a", len(A_PROMPT), 4, 3, BLOCKS["a"], RowParams(0.0, 0, 1.0, 0, (), (), 1), None)
    state.pending_drafts = [11, 12]
    assert ModelRunner._fill_drafts(state, (-1, 9, -1, -1)) == (11, 9, -1, -1)
    assert ModelRunner._fill_drafts(state, [-1, -1]) == (11, 12)
    assert ModelRunner._fill_drafts(state, ()) == ()


def test_an_engine_built_without_record_steps_keeps_no_records(tiny):
    """Records live only in the StepRecorder wrapper: without record_steps the engine drives the bare
    runner, which verifies drafts all the same."""
    engine = make_engine(tiny)
    assert engine.step_recorder is None and engine.core.runner is engine.runner
    runner = engine.runner
    resolve(run(runner, step(new=[new("a")], num_scheduled={"a": 4})))
    assert resolve(
        run(runner, step(cached=[cached("a", 4)], num_scheduled={"a": 2}, spec={"a": [63]}))
    ).sampled_token_ids == [A_GREEDY[1:3]]


def test_synthetic_acceptance_accepts_wrong_drafts(tiny):
    """At a SYNTHETIC rate of 1 every draft is accepted whatever the target says: drafts (1, 2) are
    wrong for the model, yet the step emits three tokens (real verification would emit one)."""
    runner = make_runner(tiny, synthetic_acceptance_rate=1.0)
    resolve(run(runner, step(new=[new("a")], num_scheduled={"a": 4})))
    out = resolve(run(runner, step(cached=[cached("a", 4)], num_scheduled={"a": 3}, spec={"a": [1, 2]})))
    assert len(out.sampled_token_ids[0]) == 3
    assert out.sampled_token_ids[0][0] == A_GREEDY[1]


def test_a_step_of_prefill_chunks_only_samples_nothing(tiny):
    """No row reaches its last known token: nothing is verified, the output is read back empty."""
    runner = make_runner(tiny)
    out = run(runner, step(new=[new("b", B_PROMPT)], num_scheduled={"b": 2}))
    assert out == ModelRunnerOutput(req_ids=["b"], sampled_token_ids=[[]], logprobs={})
    assert runner.num_eager_steps == 1 and runner.num_in_flight_steps == 0


class _RankZeroSampled42:
    """A tensor-parallel group whose rank 0 sampled token 42 everywhere (this rank's logits drifted)."""

    def broadcast_sampled(self, token_ids: torch.Tensor) -> torch.Tensor:
        return torch.full_like(token_ids, 42)


def test_a_tensor_parallel_rank_goes_on_with_rank_zeros_ids(tiny):
    """Invariant 45: whatever this rank's own logits say (greedy 92), it emits rank 0's id."""
    built = make_runner(tiny)
    runner = ModelRunner(built.model, built.kv_cache, built.input_batch, tp_group=_RankZeroSampled42())
    assert resolve(run(runner, step(new=[new("a")], num_scheduled={"a": 4}))).sampled_token_ids == [[42]]
    assert A_GREEDY[0] != 42


def test_a_runner_built_without_lookahead_slots_reserves_none(tiny):
    """num_lookahead_slots defaults to 0: a drafting request whose planned positions fill its blocks
    exactly runs (one lookahead slot would need a block it does not have, invariant 49)."""
    built = make_runner(tiny, speculative_config=SpeculativeConfig("mtp", 2))
    runner = ModelRunner(built.model, built.kv_cache, built.input_batch, drafter=built.drafter)
    prompt = tuple(range(3, 19))  # 16 positions planned: the 16 slots of a's 4 blocks of 4
    out = resolve(run(runner, step(new=[new("a", prompt)], num_scheduled={"a": 16})))
    assert len(out.sampled_token_ids[0]) == 1


def test_a_drafter_proposes_only_for_rows_that_sampled(tiny):
    """ngram would find a match in b's repeating prompt, but b is mid-prefill (its chunk samples
    nothing), so only a, which sampled, may get drafts."""
    runner = make_runner(
        tiny,
        speculative_config=SpeculativeConfig(method="ngram", num_speculative_tokens=2, prompt_lookup_max=2),
    )
    out = run(runner, step(new=[new("b", (5, 6, 7, 5, 6, 7)), new("a")], num_scheduled={"b": 3, "a": 4}))
    assert out.sampled_token_ids == [[], A_GREEDY[:1]]
    assert "b" not in runner.take_draft_token_ids()


def test_finished_and_preempted_requests_leave_the_runner(tiny):
    runner = make_runner(tiny)
    resolve(run(runner, step(new=[new("a"), new("b", B_PROMPT)], num_scheduled={"a": 4, "b": 6})))
    # An id the runner never held may finish too (aborted while waiting): no error.
    empty = run(runner, step(finished={"a", "never-scheduled"}, preempted={"b"}))
    assert empty == ModelRunnerOutput(req_ids=[], sampled_token_ids=[], logprobs={})
    for req_id, num_computed in (("a", 5), ("b", 7)):
        with pytest.raises(
            RunnerInvariantError, match=rf"^scheduled request '{req_id}' has no runner state$"
        ):
            runner.execute_model(step(cached=[cached(req_id, num_computed)], num_scheduled={req_id: 1}))


def test_executed_rows_are_those_of_the_step_between_execute_and_sample(tiny):
    # The hook wrappers read them between the two calls (step_recorder.py); between steps there are none.
    runner = make_runner(tiny)
    assert runner.executed_rows() == ()
    so, _ = chunked_b_beside_a()[0]
    runner.execute_model(so)
    assert [(r.state.req_id, r.num_scheduled_tokens) for r in runner.executed_rows()] == [("b", 2), ("a", 4)]
    runner.sample_tokens()
    assert runner.executed_rows() == ()


def test_calls_out_of_order_are_refused(tiny):
    runner = make_runner(tiny)
    with pytest.raises(RunnerInvariantError, match="^sample_tokens called without execute_model$"):
        runner.sample_tokens()
    runner.execute_model(step(new=[new("a")], num_scheduled={"a": 4}))
    with pytest.raises(
        RunnerInvariantError, match="^execute_model called twice without sample_tokens in between$"
    ):
        runner.execute_model(step(cached=[cached("a", 4)], num_scheduled={"a": 1}))


def test_the_injected_fault_fires_after_exactly_n_steps(tiny):
    # Fault injection is a wrapper around the runner (fault_injection.py): the engine core drives it.
    engine = make_engine(tiny, fault_after_steps=2)
    faulty = engine.core.runner
    resolve(run(faulty, step(new=[new("a")], num_scheduled={"a": 4})))
    # Until it fires, the wrapper hands the runner the draft overrides: the padded second draft rejects.
    out = run(
        faulty, step(cached=[cached("a", 4)], num_scheduled={"a": 3}, spec={"a": [63, 34]}), {"a": [63, -1]}
    )
    assert out.sampled_token_ids == [A_GREEDY[1:3]]
    with pytest.raises(InjectedFault, match="^injected fault at runner step 3$"):
        faulty.execute_model(step(cached=[cached("a", 6)], num_scheduled={"a": 1}))
    assert engine.runner.num_steps == 2  # the runner itself never saw the third step


def test_drafts_behind_a_prefill_chunk_are_refused(tiny):
    """Invariant 19: drafts follow the last known token; a chunk that stops short cannot carry any."""
    with pytest.raises(RunnerInvariantError, match="^request 'a': drafts scheduled behind a prefill chunk$"):
        make_runner(tiny).execute_model(step(new=[new("a")], num_scheduled={"a": 3}, spec={"a": [9]}))


def test_a_step_of_drafts_only_is_refused(tiny):
    """Invariant 19: at least one known token is fed; one scheduled token that is a draft is not."""
    message = (
        r"^request 'a': 1 scheduled tokens with 1 drafts from position 0, but the runner knows only 4 tokens$"
    )
    with pytest.raises(RunnerInvariantError, match=message):
        make_runner(tiny).execute_model(step(new=[new("a")], num_scheduled={"a": 1}, spec={"a": [9]}))


def test_an_input_in_flight_outside_the_latest_step_is_refused(tiny):
    """Invariant 19: only the last fed token may be in flight, and only from the latest step."""
    message = r"^request 'a': an input token in flight outside the latest step$"
    # No step in flight at all.
    with pytest.raises(RunnerInvariantError, match=message):
        make_runner(tiny).execute_model(step(new=[new("a", output=(-1,))], num_scheduled={"a": 5}))
    # a is in the latest step, but a token before the last one is in flight too (re-admitted with two).
    runner = make_runner(tiny)
    run(runner, step(new=[new("a")], num_scheduled={"a": 4}))
    with pytest.raises(RunnerInvariantError, match=message):
        runner.execute_model(step(new=[new("a", output=(-1, -1))], num_scheduled={"a": 6}, preempted={"a"}))


def test_a_decode_past_the_last_sampled_token_is_refused(tiny):
    """Invariant 19 after a prefill: a holds 5 tokens and has computed 4, so at most one more is fed."""
    runner = make_runner(tiny)
    resolve(run(runner, step(new=[new("a")], num_scheduled={"a": 4})))
    message = (
        r"^request 'a': 3 scheduled tokens with 0 drafts from position 4, but the runner knows only 5 tokens$"
    )
    with pytest.raises(RunnerInvariantError, match=message):
        runner.execute_model(step(cached=[cached("a", 4)], num_scheduled={"a": 3}))


def test_a_scheduler_count_behind_the_runner_names_both_counts(tiny):
    """Invariant 18: the message gives the scheduler's count and the runner's exact one."""
    runner = make_runner(tiny)
    resolve(run(runner, step(new=[new("a")], num_scheduled={"a": 4})))
    message = r"^request 'a': scheduler sent num_computed_tokens=3, behind the runner's exact 4$"
    with pytest.raises(RunnerInvariantError, match=message):
        runner.execute_model(step(cached=[cached("a", 3)], num_scheduled={"a": 1}))


def test_grammar_rows_that_do_not_fit_the_step_are_refused_by_name(tiny):
    """Invariant 25: bitmasks come only for requests the step verifies, one per verified row; the
    messages name the requests and the counts."""
    runner = make_runner(tiny)
    width = -(-tiny.config.vocab_size // 32)
    resolve(run(runner, step(new=[new("a")], num_scheduled={"a": 4})))
    runner.execute_model(step(cached=[cached("a", 4)], num_scheduled={"a": 1}))
    stray = GrammarOutput({"z": (0, 1), "y": (1, 1)}, np.full((2, width), -1, dtype=np.int32))
    with pytest.raises(
        RunnerInvariantError, match=r"^grammar rows for requests this step does not verify: \['y', 'z'\]$"
    ):
        runner.sample_tokens(None, stray)
    runner.execute_model(step(cached=[cached("a", 4)], num_scheduled={"a": 1}))
    two_rows = GrammarOutput({"a": (0, 2)}, np.full((2, width), -1, dtype=np.int32))
    with pytest.raises(RunnerInvariantError, match=r"^request 'a': 2 grammar rows for 0 drafts$"):
        runner.sample_tokens(None, two_rows)


def test_token_logprobs_refuses_rows_and_tokens_that_differ_in_number():
    # One logits row per emitted token: a count mismatch is a caller's bug, never a silent truncation.
    with pytest.raises(ValueError, match="zip"):
        token_logprobs(torch.zeros(2, 8), [1], 0)
    with pytest.raises(ValueError, match="zip"):
        token_logprobs(torch.zeros(1, 8), [1, 2], 3)


def test_a_one_layer_model_runs():
    # The runner takes its device from the KV cache's first layer: a model of one layer has no other.
    one_layer = build_tiny_model("qwen3", seed=1, num_hidden_layers=1)
    runner = make_runner(one_layer)
    assert runner.device == torch.device("cpu")
    out = resolve(run(runner, step(new=[new("a")], num_scheduled={"a": 4})))
    assert [len(ids) for ids in out.sampled_token_ids] == [1]
