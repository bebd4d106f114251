"""The scheduler's side of invariant 25 (docs/invariants.md), on the real scheduler and grammar: a
committed token its grammar forbids is a named error, never silently accepted; the grammar's end
finishes the request with `stop`; forbidden drafts are cut and counted. The runner's rows are written by
hand: the real runner never emits a masked token, which is exactly what these checks guard."""

import threading

import pytest

from refengine.config import EngineConfig
from refengine.core.outputs import EngineCoreOutput, ModelRunnerOutput
from refengine.core.scheduler import Scheduler, SchedulerInvariantError
from refengine.request import Request, RequestStatus
from refengine.sampling_params import SamplingParams, StructuredOutputsParams

CHOICE = StructuredOutputsParams(choice=["ab", "xyz"])
HELD = StructuredOutputsParams(regex="(ab|cd)e+")  # used by no other test: never in the grammar cache


def running(manager, k: int = 0) -> tuple[Scheduler, Request]:
    config = EngineConfig(num_blocks=32, block_size=4, max_model_len=64)
    if k:
        from refengine.spec_decode.config import SpeculativeConfig

        config = EngineConfig(num_blocks=32, block_size=4, max_model_len=64, speculative_config=SpeculativeConfig("ngram", k))
    scheduler = Scheduler(config, structured_output_manager=manager)
    request = Request("r", [1, 2, 3], SamplingParams(max_tokens=8, structured_outputs=CHOICE))
    scheduler.add_request(request)
    request.structured_output_request.wait(60)
    return scheduler, request


def step(scheduler: Scheduler, tokens: list[int]):
    so = scheduler.schedule()
    return scheduler.update_from_output(so, ModelRunnerOutput(req_ids=["r"], sampled_token_ids=[tokens]))


def test_a_committed_token_the_grammar_forbids_is_a_named_error(manager):
    scheduler, _ = running(manager)
    step(scheduler, [ord("a")])
    with pytest.raises(SchedulerInvariantError, match="emitted token 122 that its grammar forbids"):
        step(scheduler, [ord("z")])


def test_a_grammar_ahead_of_the_committed_output_is_a_named_error(manager):
    """The matcher must hold exactly the committed output: one advanced outside the scheduler (by a
    draft never rolled back) is refused with both counts."""
    scheduler, request = running(manager)
    assert request.structured_output_request.grammar.accept_tokens([ord("x")])  # the stray advance
    with pytest.raises(SchedulerInvariantError, match=r"^Request\('r', .*\): its grammar consumed 2 tokens for 1 outputs$"):
        step(scheduler, [ord("y")])


def test_the_grammar_end_finishes_the_request_with_stop(manager):
    scheduler, request = running(manager)
    step(scheduler, [ord("x")])
    outputs = step(scheduler, [ord("y")])
    assert not outputs.finished_req_ids
    outputs = step(scheduler, [ord("z")])
    assert outputs.outputs[0].finish_reason == "stop" and request.status == RequestStatus.FINISHED_STOPPED


def test_drafts_the_grammar_forbids_are_cut_and_counted(manager):
    scheduler, request = running(manager, k=3)
    step(scheduler, [ord("x")])
    scheduler.update_draft_token_ids({"r": [ord("y"), ord("q"), ord("z")]})
    assert request.spec_token_ids == [ord("y")] and scheduler.num_grammar_cut_drafts == 2
    scheduler.update_draft_token_ids({"r": [ord("q"), ord("y")]})  # the count runs over the engine's life
    assert request.spec_token_ids == [] and scheduler.num_grammar_cut_drafts == 4


def test_an_idle_scheduler_waits_for_the_oldest_grammar_still_compiling(manager):
    """wait_for_grammar: False when no request waits for its grammar; else it blocks on the oldest such
    compile for at most its bound and says True. The compile is held on purpose (an event), the one way
    to keep it unfinished; the bound, not the compile, must end the wait."""
    config = EngineConfig(num_blocks=32, block_size=4, max_model_len=64)
    scheduler = Scheduler(config, structured_output_manager=manager)
    assert scheduler.wait_for_grammar(0.01) is False  # nothing waits at all
    release = threading.Event()
    compile_grammar = manager.backend.compile

    def held_compile(params):
        release.wait(timeout=60)
        return compile_grammar(params)

    manager.backend.compile = held_compile
    try:
        plain = Request("plain", [1, 2], SamplingParams(max_tokens=4))
        scheduler.add_request(plain)
        assert scheduler.wait_for_grammar(0.01) is False  # a waiting request without a grammar
        held = Request("held", [1, 2, 3], SamplingParams(max_tokens=8, structured_outputs=HELD))
        scheduler.add_request(held)
        assert held.status == RequestStatus.WAITING_FOR_FSM
        assert scheduler.wait_for_grammar(0.01) is True
        assert not held.structured_output_request.is_ready()
    finally:
        release.set()
        manager.backend.compile = compile_grammar


def test_a_failed_compile_aborts_its_request_alone_and_the_next_one_is_admitted(manager):
    """Past the front ends' validation, a grammar that fails to compile aborts its request with the
    reason and no tokens, in the step that finds it; the request behind it is admitted in that step."""
    config = EngineConfig(num_blocks=32, block_size=4, max_model_len=64)
    scheduler = Scheduler(config, structured_output_manager=manager)
    unclosed = StructuredOutputsParams(regex="(x")
    bad = Request("bad", [1, 2, 3], SamplingParams(max_tokens=8, structured_outputs=unclosed))
    scheduler.add_request(bad)
    scheduler.add_request(Request("good", [4, 5], SamplingParams(max_tokens=4), arrival_index=1))
    bad.structured_output_request.wait(60)
    error = bad.structured_output_request.compile_error
    assert error
    so = scheduler.schedule()
    assert so.num_scheduled_tokens == {"good": 2}
    outputs = scheduler.update_from_output(so, ModelRunnerOutput(req_ids=["good"], sampled_token_ids=[[7]]))
    aborted = [o for o in outputs.outputs if o.req_id == "bad"]
    assert aborted == [EngineCoreOutput("bad", (), RequestStatus.FINISHED_ABORTED.finish_reason, error)]
    assert bad.status == RequestStatus.FINISHED_ABORTED and "bad" in outputs.finished_req_ids


def test_a_compiled_request_that_finds_no_blocks_waits_as_a_plain_request(manager):
    # Its grammar is ready, so it leaves WAITING_FOR_FSM even when the KV cache has no room for it yet.
    config = EngineConfig(num_blocks=4, block_size=4, max_model_len=16)
    scheduler = Scheduler(config, structured_output_manager=manager)
    scheduler.add_request(Request("big", list(range(1, 15)), SamplingParams(max_tokens=2)))
    so = scheduler.schedule()
    assert so.num_scheduled_tokens == {"big": 14}
    late = Request("late", [1, 2, 3], SamplingParams(max_tokens=8, structured_outputs=CHOICE), arrival_index=1)
    scheduler.add_request(late)
    late.structured_output_request.wait(60)
    scheduler.update_from_output(so, ModelRunnerOutput(req_ids=["big"], sampled_token_ids=[[7]]))
    assert scheduler.schedule().num_scheduled_tokens == {"big": 1}  # big's 4 blocks are all there are
    assert late.status == RequestStatus.WAITING and list(scheduler.waiting) == [late]


def test_a_scheduler_without_a_grammar_manager_refuses_a_structured_request_by_name():
    scheduler = Scheduler(EngineConfig(num_blocks=32, block_size=4, max_model_len=64))
    request = Request("r", [1, 2, 3], SamplingParams(max_tokens=8, structured_outputs=CHOICE))
    with pytest.raises(ValueError, match=r"^request 'r' asks for structured output, which this engine lacks$"):
        scheduler.add_request(request)
    assert not scheduler.has_requests()


def test_only_sampling_requests_with_a_grammar_get_bitmask_rows(manager):
    """The scheduler picks the bitmask's requests: a plain request and a prefill chunk of a structured
    one get no row, and a step without any structured request that samples gets no bitmask."""
    config = EngineConfig(num_blocks=32, block_size=4, max_model_len=64, max_num_batched_tokens=16)
    scheduler = Scheduler(config, structured_output_manager=manager)
    params = SamplingParams(max_tokens=8, structured_outputs=CHOICE)
    chunked = Request("chunk", list(range(1, 21)), params)  # 20 prompt tokens: a chunk of 16 this step
    for request in (Request("plain", [1, 2], SamplingParams(max_tokens=8)), Request("r", [1, 2, 3], params), chunked):
        scheduler.add_request(request)
        if request.structured_output_request is not None:
            request.structured_output_request.wait(60)
    so = scheduler.schedule()
    assert set(so.num_scheduled_tokens) == {"plain", "r", "chunk"} and chunked.is_prefill_chunk
    assert scheduler.get_grammar_bitmask(so).rows == {"r": (0, 1)}
    rows = {"plain": [5], "r": [ord("x")], "chunk": []}
    scheduler.update_from_output(so, ModelRunnerOutput(req_ids=list(rows), sampled_token_ids=list(rows.values())))
    scheduler.finish_requests(["r", "chunk"], RequestStatus.FINISHED_ABORTED)
    plain_only = scheduler.schedule()
    assert scheduler.get_grammar_bitmask(plain_only) is None
