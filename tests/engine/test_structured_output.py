"""Structured output through the real engine on a tiny model: outputs follow their constraint, sync and
async, with and without drafts; masks of draft rows follow the drafts; rejected drafts roll back; drafts
the grammar forbids are cut; grammars compile off the engine thread.

The teacher drafter proposes what the sync no-spec baseline emitted, so every draft row is one the
target accepts exactly when its mask was computed through the right drafts (invariant 25,
docs/invariants.md).
"""

import json
import re
import threading
import time

import jsonschema
import pytest

from refengine.engine.llm import LLM
from refengine.model.tiny import build_tiny_model
from refengine.oracle.teacher import TeacherProposer, scripted_accepted
from refengine.request import RequestStatus
from refengine.sampling_params import SamplingParams, StructuredOutputsParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.structured_output.backend import GrammarError

PROMPTS = [[3 + i, 50 + 7 * i, 9, 120 - i] * (1 + i % 3) for i in range(4)]
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no", "maybe"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
        "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 3},
    },
    "required": ["answer", "score", "tags"],
    "additionalProperties": False,
}
REGEX = r"(ab|ba)[0-9]{1,3}(x|yz)"
CHOICES = ["alpha", "beta", "gamma delta"]
CONSTRAINTS = {
    "json": StructuredOutputsParams(json=SCHEMA),
    "regex": StructuredOutputsParams(regex=REGEX),
    "choice": StructuredOutputsParams(choice=CHOICES),
}
K = 3


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model("qwen3", seed=4)


def params_for(constraint: StructuredOutputsParams) -> SamplingParams:
    # No ignore_eos and room to finish: the grammar, not max_tokens, ends each output.
    return SamplingParams(temperature=0.0, max_tokens=64, structured_outputs=constraint)


def engine(tiny, *, async_scheduling, spec=False, **kw) -> LLM:
    return LLM(
        tiny, num_blocks=128, block_size=4, max_model_len=128, async_scheduling=async_scheduling,
        speculative_config=SpeculativeConfig("eagle", K) if spec else None, record_steps=spec, **kw,
    )


def with_teacher(llm: LLM, tiny, baseline, corrupt_index=None) -> LLM:
    llm.engine.runner.drafter = TeacherProposer(
        [(*p, *o.token_ids) for p, o in zip(PROMPTS, baseline, strict=True)], K, tiny.config.vocab_size, corrupt_index
    )
    return llm


def run(llm: LLM, params, *, batch_queue):
    return llm.generate(PROMPTS, params, batch_queue=batch_queue)


def check_valid(name: str, texts: list[str]) -> None:
    for text in texts:
        if name == "json":
            jsonschema.validate(json.loads(text), SCHEMA)
        elif name == "regex":
            assert re.fullmatch(REGEX, text), text
        else:
            assert text in CHOICES, text


@pytest.fixture(scope="module")
def baselines(tiny):
    """The sync no-spec outputs of each constraint: what every other front must emit."""
    return {
        name: run(engine(tiny, async_scheduling=False), params_for(c), batch_queue=False)
        for name, c in CONSTRAINTS.items()
    }


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
def test_outputs_follow_the_constraint_and_end_by_the_grammar(baselines, name):
    outs = baselines[name]
    check_valid(name, [o.text for o in outs])
    assert all(o.finish_reason == "stop" for o in outs)
    assert len({tuple(o.token_ids) for o in outs}) > 1 or name == "choice"  # the prompts steer the output


def test_grammar_end_stops_even_with_ignore_eos(tiny):
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, structured_outputs=CONSTRAINTS["choice"])
    outs = run(engine(tiny, async_scheduling=False), params, batch_queue=False)
    check_valid("choice", [o.text for o in outs])
    assert all(o.finish_reason == "stop" for o in outs)


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
@pytest.mark.parametrize(("async_scheduling", "batch_queue"), [(False, False), (True, False), (True, True)])
def test_teacher_drafts_are_all_accepted_under_the_grammar(tiny, baselines, name, async_scheduling, batch_queue):
    """Invariant 25: row j of a verification is masked by the grammar advanced through drafts[:j]. The
    teacher's drafts are the baseline's tokens, so every one is accepted, and the output is the
    baseline's, sync and async at depth 1 and 2."""
    baseline = baselines[name]
    llm = with_teacher(engine(tiny, async_scheduling=async_scheduling, spec=True), tiny, baseline)
    outs = run(llm, params_for(CONSTRAINTS[name]), batch_queue=batch_queue)
    assert [o.token_ids for o in outs] == [o.token_ids for o in baseline]
    records = [r for o in outs for r in o.steps]
    assert any(r.num_accepted >= 2 for r in records), "no verification accepted a draft past its first row"
    # Every draft but -1 pads (slots the teacher had nothing for, near the end) is accepted.
    assert all(r.num_accepted == scripted_accepted(r.draft_token_ids, None) for r in records), records
    assert llm.engine.structured_output_manager.num_compiles == 1


@pytest.mark.parametrize(("async_scheduling", "batch_queue"), [(False, False), (True, True)])
def test_rollback_after_rejected_drafts(tiny, baselines, async_scheduling, batch_queue):
    """The corrupted teacher's second draft of every verification is wrong: it is rejected, the tentative
    advance of the grammar through it is rolled back, and the output is still the baseline's."""
    baseline = baselines["json"]
    llm = with_teacher(engine(tiny, async_scheduling=async_scheduling, spec=True), tiny, baseline, corrupt_index=1)
    outs = run(llm, params_for(CONSTRAINTS["json"]), batch_queue=batch_queue)
    assert [o.token_ids for o in outs] == [o.token_ids for o in baseline]
    stats = llm.engine.core.scheduler.spec_decoding_stats
    assert stats.num_accepted_tokens > 0 and stats.num_draft_tokens > stats.num_accepted_tokens


@pytest.mark.parametrize(("async_scheduling", "batch_queue"), [(False, False), (True, True)])
def test_drafts_the_grammar_forbids_are_cut_before_verification(tiny, baselines, async_scheduling, batch_queue):
    """A corrupted draft that the grammar forbids is cut (sync) or padded with -1 (async) before the
    target sees it, and counted. In sync mode the drafts a step verified are exactly the ones kept, and
    each was allowed where it stood."""
    baseline = baselines["choice"]
    llm = with_teacher(engine(tiny, async_scheduling=async_scheduling, spec=True), tiny, baseline, corrupt_index=1)
    outs = run(llm, params_for(CONSTRAINTS["choice"]), batch_queue=batch_queue)
    assert [o.token_ids for o in outs] == [o.token_ids for o in baseline]
    assert llm.engine.core.scheduler.num_grammar_cut_drafts > 0
    if async_scheduling:
        return  # the records hold the drafts fed to the model, before the cut
    manager = llm.engine.structured_output_manager
    for prompt, out in zip(PROMPTS, outs, strict=True):
        for record in out.steps:
            grammar = manager.request(CONSTRAINTS["choice"]).grammar
            assert grammar.accept_tokens(out.token_ids[: record.position - len(prompt)])
            assert grammar.validate_tokens(list(record.draft_token_ids)) == len(record.draft_token_ids), record


@pytest.mark.parametrize("spec", [False, True])
def test_async_grammar_request_takes_the_deferred_branch(tiny, baselines, spec):
    """Invariant 16: with output in flight, a grammar request is sampled only after that output is
    applied and its masks computed from it; the tokens equal the sync baseline. Without drafts its
    sampled ids stay on the device (the runner needs none of them: the scheduler owns the grammar);
    with drafts they come back read, for the grammar to judge the next drafts on the host."""
    baseline = baselines["json"]
    llm = engine(tiny, async_scheduling=True, spec=spec)
    outs = run(llm, params_for(CONSTRAINTS["json"]), batch_queue=True)
    assert [o.token_ids for o in outs] == [o.token_ids for o in baseline]
    assert llm.engine.core.num_deferred_steps > 0
    runner = llm.engine.runner
    if spec:
        # A grammar judges the next drafts on the host: its steps come back read.
        assert runner.num_readback_steps > 0
    else:
        assert runner.num_in_flight_steps > 0


def test_grammar_compiles_off_the_engine_thread_without_blocking_the_batch(tiny):
    """A request waits for its grammar (WAITING_FOR_FSM) while the others run. The compile is held on
    purpose (an event), the one way to make it slow on demand."""
    llm = engine(tiny, async_scheduling=False)
    manager = llm.engine.structured_output_manager
    release = threading.Event()
    compile_grammar = manager.backend.compile
    threads = []

    def held_compile(params):
        threads.append(threading.current_thread().name)
        release.wait(timeout=60)
        return compile_grammar(params)

    manager.backend.compile = held_compile
    from refengine.request import Request

    core = llm.engine.core
    free = Request("free", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    held = Request("held", PROMPTS[1], params_for(CONSTRAINTS["choice"]), eos_token_id=tiny.tokenizer.eos_token_ids[0])
    core.add_request(held)
    core.add_request(free)
    finished = set()
    for _ in range(4):
        finished |= core.step().finished_req_ids
    assert finished == {"free"}
    assert held.status == RequestStatus.WAITING_FOR_FSM
    release.set()
    deadline = time.monotonic() + 120  # a bound on a hang, not a timing
    while core.has_work() and time.monotonic() < deadline:
        finished |= core.step().finished_req_ids
    assert finished == {"free", "held"} and held.finish_reason == "stop"
    assert threads and threads[0].startswith("refengine-grammar")


def test_grammar_cache_is_keyed_by_the_schema(tiny):
    llm = engine(tiny, async_scheduling=False)
    reordered = dict(reversed(list(SCHEMA.items())))
    params = [params_for(StructuredOutputsParams(json=s)) for s in (SCHEMA, reordered, json.dumps(SCHEMA))]
    outs = llm.generate(PROMPTS[:3], params)
    check_valid("json", [o.text for o in outs])
    assert llm.engine.structured_output_manager.num_compiles == 1


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        (StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "nonsense"}}}), "nonsense"),
        (StructuredOutputsParams(regex="(unclosed"), "regex"),
        (StructuredOutputsParams(grammar="start: undefined_rule"), "undefined_rule"),
    ],
)
def test_a_bad_constraint_fails_only_its_own_call(tiny, constraint, message):
    llm = engine(tiny, async_scheduling=False)
    with pytest.raises(GrammarError, match=message):
        llm.generate(PROMPTS[:1], params_for(constraint))
    # The engine is untouched: the next call runs.
    (out,) = llm.generate(PROMPTS[:1], params_for(CONSTRAINTS["choice"]))
    assert out.text in CHOICES


def test_a_grammar_that_fails_to_compile_in_the_engine_fails_only_its_request(tiny):
    """Past the front ends' validation (a request added to the core directly), a compile failure ends
    that request alone, aborted with the reason; the others run to the end."""
    from refengine.request import Request

    core = engine(tiny, async_scheduling=True).engine.core
    eos = tiny.tokenizer.eos_token_ids[0]
    bad = Request("bad", PROMPTS[0], params_for(StructuredOutputsParams(regex="(unclosed")), eos_token_id=eos)
    good = Request("good", PROMPTS[1], params_for(CONSTRAINTS["choice"]), eos_token_id=eos, arrival_index=1)
    core.add_request(bad)
    core.add_request(good)
    finished = set()
    deadline = time.monotonic() + 120  # a bound on a hang, not a timing: the compile fails in milliseconds
    while core.has_work() and time.monotonic() < deadline:
        outputs = core.step_with_batch_queue()
        finished |= set() if outputs is None else outputs.finished_req_ids
    assert bad.status == RequestStatus.FINISHED_ABORTED and "GrammarError" in bad.stop_reason
    assert good.status == RequestStatus.FINISHED_STOPPED and finished == {"bad", "good"}
