"""Async scheduling through both fronts: identical tokens, the deferred constraint branch, and the
depth-2 overlap witness.

Invariant numbers refer to docs/invariants.md.
"""

import threading

import pytest

from refengine.engine.llm import LLM
from refengine.model.tiny import build_tiny_model
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig

PROMPTS = [[3 + i, 50 + 7 * i, 9, 120 - i] * (1 + i % 3) for i in range(8)]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model("qwen3", seed=4)


def generate(tiny, params, *, async_scheduling, batch_queue, **kw):
    llm = LLM(tiny, num_blocks=96, block_size=4, max_model_len=96, async_scheduling=async_scheduling, **kw)
    return [o.token_ids for o in llm.generate(PROMPTS, params, batch_queue=batch_queue)], llm


@pytest.mark.parametrize("chunked", [False, True])
def test_sync_async_depth1_depth2_identical(tiny, chunked):
    kw = {"max_num_batched_tokens": 5} if chunked else {}
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    sampled = [SamplingParams(temperature=0.9, seed=i, max_tokens=12, ignore_eos=True) for i in range(len(PROMPTS))]
    for params in (greedy, sampled):
        sync, _ = generate(tiny, params, async_scheduling=False, batch_queue=False, **kw)
        depth1, _ = generate(tiny, params, async_scheduling=True, batch_queue=False, **kw)
        depth2, llm = generate(tiny, params, async_scheduling=True, batch_queue=True, **kw)
        assert llm.engine.core.max_concurrent_batches == 2
        assert sync == depth1 == depth2


@pytest.mark.parametrize("spec", [None, '{"method": "eagle", "num_speculative_tokens": 2}'])
def test_deferred_branch_with_bad_words_keeps_tokens(tiny, spec):
    """Invariant 16: a constrained request with output in flight is sampled only after that output is
    applied and its drafts validated; the tokens equal sync no-spec, and the deferred branch ran."""
    base, _ = generate(tiny, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
                       async_scheduling=False, batch_queue=False)
    banned = [[t] for t in sorted({tokens[3] for tokens in base})[:3]]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, bad_words_token_ids=banned)
    sync, _ = generate(tiny, params, async_scheduling=False, batch_queue=False)
    speculative_config = None if spec is None else SpeculativeConfig.from_json(spec)
    depth2, llm = generate(tiny, params, async_scheduling=True, batch_queue=True,
                           speculative_config=speculative_config)
    assert sync == depth2
    assert sync != base  # the constraint changed something
    assert all(t not in {b[0] for b in banned} for tokens in sync for t in tokens)
    assert llm.engine.core.num_deferred_steps > 0


def test_depth2_schedules_next_frame_while_current_executes(tiny):
    """The witness: schedule(n+1) happens before update_from_output(n); execution runs on the runner
    thread, so the engine thread is free to schedule meanwhile."""
    llm = LLM(tiny, num_blocks=96, block_size=4, max_model_len=96, async_scheduling=True)
    core = llm.engine.core
    events: list[tuple[str, str]] = []
    lock = threading.Lock()

    def record(name, fn):
        def wrapped(*args, **kwargs):
            with lock:
                events.append((name, threading.current_thread().name))
            return fn(*args, **kwargs)

        return wrapped

    core.scheduler.schedule = record("schedule", core.scheduler.schedule)
    core.scheduler.update_from_output = record("update", core.scheduler.update_from_output)
    core.runner.execute_model = record("execute", core.runner.execute_model)
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    names = [name for name, _ in events]
    # Frame 1 is scheduled and launched, then frame 2 is scheduled before frame 1's output is applied.
    first_update = names.index("update")
    assert names[:first_update].count("schedule") == 2
    assert {thread for name, thread in events if name == "execute"} == {"refengine-runner_0"}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_depth1_runs_the_runner_on_the_runner_thread(tiny, async_scheduling):
    """Depth 1 (sync, and async without the batch queue) executes and samples on the same runner thread
    as depth 2, so an A/B of the two measures the overlap alone, not two threads' OpenMP teams."""
    llm = LLM(tiny, num_blocks=96, block_size=4, max_model_len=96, async_scheduling=async_scheduling)
    runner = llm.engine.core.runner
    threads: list[tuple[str, str]] = []

    def record(name, fn):
        def wrapped(*args, **kwargs):
            threads.append((name, threading.current_thread().name))
            return fn(*args, **kwargs)

        return wrapped

    runner.execute_model = record("execute", runner.execute_model)
    runner.sample_tokens = record("sample", runner.sample_tokens)
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), batch_queue=False)
    assert {name for name, _ in threads} == {"execute", "sample"}
    assert {thread for _, thread in threads} == {"refengine-runner_0"}


def test_step_records_hold_only_frames_whose_output_was_kept(tiny):
    """At depth 2 a request that reaches max_tokens through accepted drafts already has its next frame
    in flight; the runner verifies drafts in it, and the scheduler discards its output. The request's
    step records must leave that frame out, so that they agree with the acceptance the scheduler
    counted (the oracle compares records between arms)."""
    from refengine.spec_decode.config import SpeculativeConfig

    llm = LLM(tiny, num_blocks=96, block_size=4, max_model_len=96, record_steps=True,
              speculative_config=SpeculativeConfig("mtp", 3), synthetic_acceptance_rate=1.0)
    params = [SamplingParams(temperature=0.0, max_tokens=6 + i, ignore_eos=True) for i in range(len(PROMPTS))]
    outs = llm.generate(PROMPTS, params, batch_queue=True)
    stats = llm.engine.core.scheduler.spec_decoding_stats
    records = [r for o in outs for r in o.steps]
    assert records and all(r.position < len(o.prompt_token_ids) + len(o.token_ids) for o in outs for r in o.steps)
    assert stats.num_accepted_tokens == sum(r.num_accepted for r in records)
    assert stats.num_drafts == len(records)
    assert not llm.engine.step_recorder.records, "records of finished requests are left behind"
