"""Sync scheduling: one step is applied before the next is planned, and drafts are real ids.

Invariant numbers refer to docs/invariants.md.
"""

import pytest

from refengine.core.outputs import ModelRunnerOutput
from refengine.core.scheduler import SchedulerInvariantError
from refengine.request import RequestStatus

from .harness import EOS, make_request, make_scheduler, runner_output


def step(scheduler, rows):
    so = scheduler.schedule()
    return so, scheduler.update_from_output(so, runner_output(so, rows))


def decode_ready(k=3, prompt_len=8, drafts=(5, 6, 7), **kwargs):
    """A request whose prefill is done, holding `drafts` for its next step."""
    scheduler = make_scheduler(k=k, **kwargs)
    request = make_request("a", prompt_len, max_tokens=kwargs.pop("max_tokens", 50))
    scheduler.add_request(request)
    step(scheduler, {"a": [1]})
    scheduler.update_draft_token_ids({"a": list(drafts)})
    return scheduler, request


def test_chunked_prefill_then_decode():
    scheduler = make_scheduler(max_num_batched_tokens=4)
    request = make_request("a", 10, max_tokens=3)
    scheduler.add_request(request)
    counts = []
    for row in ([], [], [11], [12], [13]):
        so, out = step(scheduler, {"a": row})
        counts.append(so.num_scheduled_tokens["a"])
    assert counts == [4, 4, 2, 1, 1]
    assert request.output_token_ids == (11, 12, 13) and request.is_finished
    assert out.outputs[0].finish_reason == "length"
    assert out.finished_req_ids == {"a"}


def test_new_request_data_then_cached_request_data():
    scheduler = make_scheduler(max_num_batched_tokens=5, block_size=2)
    scheduler.add_request(make_request("a", 8, seed=3))
    so, _ = step(scheduler, {})
    (new,) = so.scheduled_new_reqs
    assert (new.req_id, new.num_computed_tokens, new.rng_key, new.eos_token_id) == ("a", 0, 3, EOS)
    assert new.prompt_token_ids == tuple(range(100, 108)) and new.output_token_ids == ()
    assert new.block_ids == (0, 1, 2)
    so, _ = step(scheduler, {"a": [9]})
    assert so.scheduled_new_reqs == ()
    (cached,) = so.scheduled_cached_reqs
    assert (cached.num_computed_tokens, cached.block_ids) == (5, (0, 1, 2, 3))


def test_fcfs_admission_capped_by_max_num_seqs():
    scheduler = make_scheduler(max_num_seqs=2)
    for req_id in "abc":
        scheduler.add_request(make_request(req_id, 4, max_tokens=1))
    so, out = step(scheduler, {"a": [1], "b": [1]})
    assert list(so.num_scheduled_tokens) == ["a", "b"]
    assert out.finished_req_ids == {"a", "b"}
    so, _ = step(scheduler, {"c": [1]})
    assert list(so.num_scheduled_tokens) == ["c"] and so.finished_req_ids == {"a", "b"}
    assert not scheduler.requests and scheduler.has_requests()


def test_max_model_len_caps_scheduling_and_finishes_by_length():
    scheduler, request = decode_ready(k=3, prompt_len=8, max_model_len=11)
    so, out = step(scheduler, {"a": [5, 6]})  # nc=8: only positions 8 and 9 may be computed
    assert so.num_scheduled_tokens["a"] == 2 and so.scheduled_spec_decode_tokens["a"] == [5]
    assert request.num_tokens == 11 and out.outputs[0].finish_reason == "length"


def test_budget_caps_drafts():
    """Invariant 2: the scheduled draft list is cut to the draft slots the budget leaves."""
    scheduler, request = decode_ready(k=3, prompt_len=3, max_num_batched_tokens=3)
    so = scheduler.schedule()
    assert so.num_scheduled_tokens["a"] == 3
    assert so.scheduled_spec_decode_tokens["a"] == [5, 6]
    assert request.spec_token_ids == []  # Invariant 3: scheduling consumes the drafts


def test_rejection_rollback():
    """Invariant 5: nc -= rejected drafts, so the next step recomputes from the first rejected position."""
    scheduler, request = decode_ready(k=3, drafts=(5, 6, 7))
    so = scheduler.schedule()
    assert (so.num_scheduled_tokens["a"], request.num_computed_tokens) == (4, 12)
    scheduler.update_from_output(so, runner_output(so, {"a": [5, 9]}))  # 1 accepted, 2 rejected
    assert request.output_token_ids == (1, 5, 9)
    assert request.num_computed_tokens == 10 == request.num_tokens - 1


@pytest.mark.parametrize(
    ("drafts", "row", "expected"),
    [
        ([1, 2, 3], [1, 2, 3, 4], (1, 3, 3, [1, 1, 1])),
        ([1, 2, 3], [1, 5], (1, 3, 1, [1, 0, 0])),
        ([1, 2, 3], [9], (1, 3, 0, [0, 0, 0])),
        ([1, 2], [1, 2, 3], (1, 2, 2, [1, 1])),
        ([], [4], (0, 0, 0, [])),
    ],
)
def test_spec_decoding_stats(drafts, row, expected):
    scheduler, request = decode_ready(k=3, drafts=drafts)
    so = scheduler.schedule()
    out = scheduler.update_from_output(so, runner_output(so, {"a": row}))
    for stats in (scheduler.spec_decoding_stats, request.spec_decoding_stats):
        got = (
            stats.num_drafts,
            stats.num_draft_tokens,
            stats.num_accepted_tokens,
            stats.num_accepted_tokens_per_pos,
        )
        assert got == expected
    assert (out.spec_decoding_stats is None) == (not drafts)


@pytest.mark.parametrize(
    ("params", "row", "kept", "reason", "stop_reason"),
    [
        ({}, [4, EOS, 5, 6], [4, EOS], "stop", None),
        ({"stop_token_ids": [5]}, [4, 5, 6, 7], [4, 5], "stop", 5),
        ({"max_tokens": 3}, [4, 5, 6, 7], [4, 5], "length", None),
        # The prefill already produced one output token, so the row holds outputs 2 to 5.
        ({"min_tokens": 4}, [4, EOS, 5, EOS], [4, EOS, 5, EOS], "stop", None),
        ({"min_tokens": 4, "stop_token_ids": [4]}, [4, 4, 6, 4], [4, 4, 6, 4], "stop", 4),
        ({"min_tokens": 6, "stop_token_ids": [4]}, [4, 4, 6, 4], [4, 4, 6, 4], None, None),
        ({"ignore_eos": True}, [EOS, EOS, 6, 7], [EOS, EOS, 6, 7], None, None),
    ],
)
def test_stop_trims_accepted_drafts(params, row, kept, reason, stop_reason):
    """Invariant 6: tokens after a stop are dropped and their positions uncounted."""
    scheduler = make_scheduler(k=3)
    request = make_request("a", 8, **{"max_tokens": 50, **params})
    scheduler.add_request(request)
    step(scheduler, {"a": [3]})
    scheduler.update_draft_token_ids({"a": row[:3]})
    so, out = step(scheduler, {"a": row})
    (output,) = out.outputs
    assert list(output.new_token_ids) == kept and request.output_token_ids == (3, *kept)
    assert output.finish_reason == reason and output.stop_reason == stop_reason
    assert request.num_computed_tokens == request.num_tokens - 1
    if reason is not None:
        assert scheduler.kv_cache_manager.num_free_blocks == 128 and "a" not in scheduler.requests


def test_stop_strings_are_checked_token_by_token():
    seen = []

    def stop_checker(request):
        seen.append(request.output_token_ids)
        return "END" if request.output_token_ids[-1] == 6 else None

    scheduler = make_scheduler(k=3, stop_checker=stop_checker)
    request = make_request("a", 4, stop=["END"], min_tokens=2, max_tokens=50)
    scheduler.add_request(request)
    step(scheduler, {"a": [6]})  # below min_tokens: not checked
    scheduler.update_draft_token_ids({"a": [5, 6, 7]})
    _, out = step(scheduler, {"a": [5, 6, 7, 8]})
    assert seen == [(6, 5), (6, 5, 6)]
    assert out.outputs[0].new_token_ids == (5, 6) and out.outputs[0].stop_reason == "END"


def test_add_request_refusals():
    scheduler = make_scheduler(max_model_len=16)
    scheduler.add_request(make_request("a", 4))
    with pytest.raises(ValueError, match="'a' is already in use"):
        scheduler.add_request(make_request("a", 4))
    with pytest.raises(ValueError, match="prompt of 16 tokens .* max_model_len=16"):
        scheduler.add_request(make_request("b", 16))
    with pytest.raises(ValueError, match="stop strings but the scheduler has no stop_checker"):
        scheduler.add_request(make_request("c", 4, stop=["x"]))


def test_chunked_prefill_discards_drafts():
    """Invariant 8: drafts proposed after a non-final chunk would sit at prompt positions."""
    scheduler = make_scheduler(k=2, max_num_batched_tokens=4)
    request = make_request("a", 6)
    scheduler.add_request(request)
    step(scheduler, {})
    scheduler.update_draft_token_ids({"a": [7, 7]})
    assert request.spec_token_ids == []
    so, _ = step(scheduler, {"a": [1]})
    assert so.num_scheduled_tokens["a"] == 2 and "a" not in so.scheduled_spec_decode_tokens
    scheduler.update_draft_token_ids({"a": [7, 8]})  # after the final chunk: kept
    assert request.spec_token_ids == [7, 8]
    with pytest.raises(SchedulerInvariantError, match="3 drafts for a, k=2"):
        scheduler.update_draft_token_ids({"a": [1, 2, 3]})


def test_preemption_clears_drafts():
    """Pool of 12 one-token blocks: when a cannot grow, the newest request b is preempted (recompute)."""
    scheduler = make_scheduler(k=2, block_size=1, num_blocks=12, max_model_len=10)
    a, b = make_request("a", 4, max_tokens=20), make_request("b", 4, max_tokens=20)
    scheduler.add_request(a)
    scheduler.add_request(b)
    step(scheduler, {"a": [1], "b": [2]})  # 6 + 6 blocks (4 prompt + 2 lookahead each)
    scheduler.update_draft_token_ids({"a": [3, 3], "b": [4, 4]})
    so = scheduler.schedule()
    assert so.preempted_req_ids == {"b"} and list(so.num_scheduled_tokens) == ["a"]
    assert b.status == RequestStatus.PREEMPTED and scheduler.waiting[0] is b
    assert (b.num_computed_tokens, b.spec_token_ids, b.num_preemptions) == (0, [], 1)
    assert scheduler.kv_cache_manager.get_block_ids("b") == ()
    scheduler.update_from_output(so, runner_output(so, {"a": [3, 3, 5]}))
    scheduler.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    so = scheduler.schedule()
    (resumed,) = so.scheduled_new_reqs
    assert so.finished_req_ids == {"a"} and resumed.req_id == "b"
    assert resumed.output_token_ids == (2,) and so.num_scheduled_tokens["b"] == 5  # recompute 4 + 1


def test_preemption_pops_the_newest_running_request():
    scheduler = make_scheduler(block_size=1, num_blocks=10, max_model_len=10)
    for req_id in "abc":
        scheduler.add_request(make_request(req_id, 3, max_tokens=20))
    step(scheduler, {"a": [1], "b": [1], "c": [1]})
    so, _ = step(scheduler, {"a": [1], "b": [1]})  # 9 blocks used, a and b each need one more
    assert so.preempted_req_ids == {"c"} and list(so.num_scheduled_tokens) == ["a", "b"]


def test_finish_requests_aborts_and_frees():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", 4))
    scheduler.add_request(make_request("w", 4))
    step(scheduler, {"a": [1], "w": [1]})
    scheduler.finish_requests(["a", "w", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert scheduler.kv_cache_manager.num_free_blocks == 128 and not scheduler.requests
    assert scheduler.schedule().finished_req_ids == {"a", "w"}
    with pytest.raises(ValueError, match="finished status, got RUNNING"):
        scheduler.finish_requests(["a"], RequestStatus.RUNNING)


def test_update_from_output_needs_one_row_per_scheduled_request():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", 4))
    so = scheduler.schedule()
    with pytest.raises(SchedulerInvariantError, match="runner rows"):
        scheduler.update_from_output(so, ModelRunnerOutput([], []))
    with pytest.raises(SchedulerInvariantError, match=r"row \[1, 2\] for drafts \[\]"):
        scheduler.update_from_output(so, ModelRunnerOutput(["a"], [[1, 2]]))


def test_a_preempted_request_is_readmitted_before_those_already_waiting():
    """vLLM puts a preempted request at the front of the waiting queue: it was admitted first, so FCFS
    resumes it before a request that has been waiting all along (here d, held back by max_num_seqs)."""
    scheduler = make_scheduler(block_size=1, num_blocks=10, max_model_len=10, max_num_seqs=3)
    for req_id in "abcd":
        scheduler.add_request(make_request(req_id, 3, max_tokens=20))
    step(scheduler, {"a": [1], "b": [1], "c": [1]})
    assert [r.request_id for r in scheduler.waiting] == ["d"]
    so, _ = step(scheduler, {"a": [1], "b": [1]})
    assert so.preempted_req_ids == {"c"}
    assert [r.request_id for r in scheduler.waiting] == ["c", "d"]
    scheduler.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    so = scheduler.schedule()
    assert [r.req_id for r in so.scheduled_new_reqs] == ["c", "d"]


def test_long_prefill_threshold_chunks_prompts_and_admits_beside_them():
    """With long_prefill_token_threshold, a prompt gets at most that many tokens a step, so the budget that
    would have gone to the first prompt admits the others beside it; a verify step is never cut by it."""
    scheduler = make_scheduler(k=3, max_num_batched_tokens=12, long_prefill_token_threshold=2)
    for name in "abc":
        scheduler.add_request(make_request(name, 4, max_tokens=8))
    so, _ = step(scheduler, {"a": [], "b": [], "c": []})
    assert so.num_scheduled_tokens == {"a": 2, "b": 2, "c": 2}
    so, _ = step(scheduler, {"a": [1], "b": [1], "c": [1]})
    assert so.num_scheduled_tokens == {"a": 2, "b": 2, "c": 2}
    scheduler.update_draft_token_ids({"a": [5, 6, 7]})
    so = scheduler.schedule()
    assert so.num_scheduled_tokens["a"] == 4  # 1 + 3 drafts, over the threshold: not a prompt
    assert so.scheduled_spec_decode_tokens["a"] == [5, 6, 7]
