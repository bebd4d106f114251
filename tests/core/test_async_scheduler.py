"""Async scheduling: step n+1 is planned before step n's output is applied, with -1 placeholders."""

from collections import deque

import pytest

from refengine.core.async_scheduler import valid_draft_prefix
from refengine.core.scheduler import SchedulerInvariantError
from refengine.request import Request, RequestStatus
from refengine.sampling_params import SamplingParams

from .harness import EOS, EngineProbe, FakeRunner, make_request, make_scheduler, runner_output

K = 3


def apply(scheduler, so, rows):
    return scheduler.update_from_output(so, runner_output(so, rows))


def counters(request):
    return (
        request.num_tokens,
        request.num_computed_tokens,
        request.num_output_placeholders,
        request.num_in_flight_tokens,
    )


def prefilled(k=K, prompt_lens=(8,), **kwargs):
    """Requests r0, r1, ... whose prefill is applied; nothing in flight, placeholders ready."""
    scheduler = make_scheduler(async_scheduling=True, k=k, **kwargs)
    requests = [make_request(f"r{i}", n, max_tokens=100) for i, n in enumerate(prompt_lens)]
    for request in requests:
        scheduler.add_request(request)
    so = scheduler.schedule()
    apply(scheduler, so, {r.request_id: [1] for r in requests})
    return scheduler, requests


def test_worked_example_k2():
    """The worked example in docs/invariants.md, row by row (prompt P, K=2)."""
    P = 8
    scheduler = make_scheduler(async_scheduling=True, k=2)
    request = make_request("a", P, max_tokens=100)
    scheduler.add_request(request)
    s1 = scheduler.schedule()
    assert counters(request) == (P, P, 1, P) and request.spec_token_ids == [-1, -1]
    assert s1.scheduled_new_reqs[0].num_computed_tokens == 0 and "a" not in s1.scheduled_spec_decode_tokens
    s2 = scheduler.schedule()
    assert s2.num_scheduled_tokens["a"] == 3 and s2.scheduled_spec_decode_tokens["a"] == [-1, -1]
    assert counters(request) == (P, P + 3, 4, P + 3) and s2.scheduled_cached_reqs[0].num_computed_tokens == P
    apply(scheduler, s1, {"a": [11]})
    assert counters(request) == (P + 1, P + 3, 3, 3)
    s3 = scheduler.schedule()
    assert s3.num_scheduled_tokens["a"] == 3 and s3.scheduled_cached_reqs[0].num_computed_tokens == P + 3
    assert counters(request) == (P + 1, P + 6, 6, 6)
    apply(scheduler, s2, {"a": [12, 13]})  # one of two drafts accepted
    assert counters(request) == (P + 3, P + 5, 3, 3)


@pytest.mark.parametrize("accepted", [0, 1, K])
def test_placeholder_arithmetic_over_acceptance(accepted):
    """Invariant 4 in steady state with a depth-2 queue: every step schedules 1 + K, and after each
    update nc - ph == nt - 1 with exactly the other frame's 1 + K placeholders outstanding."""
    scheduler, (request,) = prefilled()
    queue = deque([scheduler.schedule()])
    for _ in range(6):
        so = scheduler.schedule()
        assert so.num_scheduled_tokens == {"r0": 1 + K} and so.scheduled_spec_decode_tokens["r0"] == [-1] * K
        queue.appendleft(so)
        nt = request.num_tokens
        apply(scheduler, queue.pop(), {"r0": [7] * (accepted + 1)})
        assert request.num_tokens == nt + accepted + 1
        assert request.num_computed_tokens - request.num_output_placeholders == request.num_tokens - 1
        assert request.num_output_placeholders == 1 + K
    stats = scheduler.spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (6, 6 * K, 6 * accepted)


def test_budget_caps_placeholder_drafts():
    """Invariant 2: a budget-capped decode carries fewer placeholder drafts and takes fewer placeholders."""
    scheduler, (a, b) = prefilled(prompt_lens=(3, 3), max_num_batched_tokens=6)
    so = scheduler.schedule()
    assert so.num_scheduled_tokens == {"r0": 4, "r1": 2}
    assert so.scheduled_spec_decode_tokens == {"r0": [-1] * K, "r1": [-1]}
    assert (a.num_output_placeholders, b.num_output_placeholders) == (4, 2)
    apply(scheduler, so, {"r0": [5, 6], "r1": [5]})
    assert b.num_computed_tokens - b.num_output_placeholders == b.num_tokens - 1 == 4


def test_prefill_chunks_get_no_placeholders():
    """Invariant 3: only the step that reaches the end of the prompt samples, so only it gets placeholders."""
    scheduler = make_scheduler(async_scheduling=True, k=2, max_num_batched_tokens=4)
    request = make_request("a", 10)
    scheduler.add_request(request)
    for expected_nc in (4, 8):
        scheduler.schedule()
        assert (request.num_computed_tokens, request.num_output_placeholders) == (expected_nc, 0)
        assert request.spec_token_ids == []
    scheduler.schedule()
    assert (request.num_computed_tokens, request.num_output_placeholders) == (10, 1)
    assert request.spec_token_ids == [-1, -1]


def test_a_request_scheduled_after_a_prefill_chunk_gets_its_placeholders():
    """A chunk listed first in the step is skipped, not the end of the step: b, whose whole prompt is
    scheduled after a's capped chunk, samples and takes its placeholders."""
    scheduler = make_scheduler(async_scheduling=True, k=2, long_prefill_token_threshold=4)
    a, b = make_request("a", 12), make_request("b", 2)
    scheduler.add_request(a)
    scheduler.add_request(b)
    so = scheduler.schedule()
    assert list(so.num_scheduled_tokens.items()) == [("a", 4), ("b", 2)]
    assert (a.num_output_placeholders, a.spec_token_ids) == (0, [])
    assert (b.num_output_placeholders, b.spec_token_ids) == (1, [-1, -1])


def test_async_scheduler_ships_only_placeholders():
    """Invariant 15: under async the scheduler never holds real draft ids; they reach it only through
    update_draft_token_ids_in_output."""
    scheduler, _ = prefilled(prompt_lens=(8, 5))
    for _ in range(3):
        so = scheduler.schedule()
        assert so.scheduled_spec_decode_tokens == {"r0": [-1] * K, "r1": [-1] * K}
        apply(scheduler, so, {"r0": [4, 5], "r1": [6]})
    with pytest.raises(SchedulerInvariantError, match="only via update_draft_token_ids_in_output"):
        scheduler.update_draft_token_ids({"r0": [1, 2, 3]})


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_stop_by_max_tokens_schedules_no_extra_step(max_tokens):
    """Invariants 1 and 7: with a frame always in flight, each request is scheduled exactly
    prompt + max_tokens - 1 tokens: no position twice, and no step whose output is trimmed away."""
    scheduler = make_scheduler(async_scheduling=True, max_num_batched_tokens=16)
    prompt_lens = {"a": 3, "b": 7, "c": 12, "d": 1}
    for req_id, n in prompt_lens.items():
        scheduler.add_request(make_request(req_id, n, max_tokens=max_tokens))
    runner = FakeRunner(scheduler.config, lambda r, i: 5, lambda r, i, n: n, lambda r, i: [])
    loop = EngineProbe(scheduler, runner, lambda loop, phase: None)
    loop.run()
    for req_id, n in prompt_lens.items():
        assert loop.delivered[req_id] == [5] * max_tokens
        assert loop.scheduled_tokens[req_id] == n + max_tokens - 1


def preempt_with_frames_in_flight(num_blocks):
    """r1 is preempted by KV pressure while its spec frames are in flight (K=4, block_size 4):
    with 8 blocks one frame is in flight, with 10 blocks two."""
    scheduler, (a, b) = prefilled(
        k=4, prompt_lens=(4, 4), block_size=4, num_blocks=num_blocks, max_model_len=24
    )
    frames = [scheduler.schedule()]
    while not frames[-1].preempted_req_ids:
        assert len(frames) < 10, "KV pressure never preempted r1"
        frames.append(scheduler.schedule())
    assert frames[-1].preempted_req_ids == {"r1"} and b.status == RequestStatus.PREEMPTED
    return scheduler, a, b, frames


def test_no_placeholder_underflow_on_stale_spec_output():
    """Invariant 9: a stale frame drains the stale count by its scheduled tokens and delivers its token,
    but rolls back nothing: ph and nc stay at 0."""
    scheduler, _, b, (s2, s3) = preempt_with_frames_in_flight(num_blocks=8)
    assert s2.scheduled_spec_decode_tokens["r1"] == [-1] * 4
    assert (b.num_computed_tokens, b.num_output_placeholders, b.num_stale_output_tokens) == (0, 0, 5)
    out = apply(scheduler, s2, {"r0": [3], "r1": [9]})  # r1: all 4 drafts rejected
    assert [o.new_token_ids for o in out.outputs if o.req_id == "r1"] == [(9,)]
    assert counters(b) == (6, 0, 0, 0) and b.num_stale_output_tokens == 0
    assert b.status == RequestStatus.PREEMPTED and b.spec_decoding_stats.num_drafts == 0


def test_preempt_marks_all_inflight_output_stale():
    """Two frames in flight: st = 2 * (1 + K); each drains 1 + K and delivers its token; ph stays 0."""
    scheduler, _, b, (s2, s3, s4) = preempt_with_frames_in_flight(num_blocks=10)
    assert b.num_stale_output_tokens == 10 == b.num_in_flight_tokens
    apply(scheduler, s2, {"r0": [3], "r1": [9]})
    assert (b.num_stale_output_tokens, b.num_output_placeholders) == (5, 0)
    apply(scheduler, s3, {"r0": [3], "r1": [4, 8]})
    assert (b.num_stale_output_tokens, b.num_output_placeholders, b.num_in_flight_tokens) == (0, 0, 0)
    assert b.output_token_ids == (1, 9, 4, 8) and b.status == RequestStatus.PREEMPTED


def test_no_readmission_while_stale():
    """Invariant 9: a preempted request stays waiting until its stale frames are back, then resumes
    with every delivered token."""
    scheduler, a, b, (s2, s3) = preempt_with_frames_in_flight(num_blocks=8)
    scheduler.finish_requests(["r0"], RequestStatus.FINISHED_ABORTED)
    assert scheduler.kv_cache_manager.num_free_blocks == 8
    s4 = scheduler.schedule()
    assert s4.num_scheduled_tokens == {} and scheduler.waiting[0] is b
    apply(scheduler, s2, {"r0": [3], "r1": [9]})
    apply(scheduler, s3, {"r0": [3]})
    s5 = scheduler.schedule()
    (resumed,) = s5.scheduled_new_reqs
    assert resumed.output_token_ids == (1, 9) and s5.num_scheduled_tokens == {"r1": 6}
    assert b.status == RequestStatus.RUNNING and b.num_output_placeholders == 1


def test_stale_frame_that_stops_finishes_the_waiting_request():
    scheduler, _, b, (s2, s3) = preempt_with_frames_in_flight(num_blocks=8)
    out = apply(scheduler, s2, {"r0": [3], "r1": [EOS, 6]})
    assert out.finished_req_ids == {"r1"} and b.output_token_ids == (1, EOS)
    assert b not in scheduler.waiting and "r1" not in scheduler.requests


def test_abort_with_frames_in_flight():
    scheduler, (a,) = prefilled()
    s1, s2 = scheduler.schedule(), scheduler.schedule()
    scheduler.finish_requests(["r0"], RequestStatus.FINISHED_ABORTED)
    assert apply(scheduler, s1, {"r0": [1, 2]}).outputs == ()
    assert apply(scheduler, s2, {"r0": [1]}).outputs == ()
    assert scheduler.schedule().finished_req_ids == {"r0"}
    assert scheduler.kv_cache_manager.num_free_blocks == 128


def banned_13(request, drafts):
    return drafts.index(13) if 13 in drafts else len(drafts)


def deferred_step(validator=banned_13):
    """r0..r2 decoding with a frame in flight; r3 constrained (bad_words); r4 still in prefill."""
    scheduler = make_scheduler(
        async_scheduling=True, k=K, draft_validator=validator, max_num_batched_tokens=30
    )
    for i in range(4):
        scheduler.add_request(make_request(f"r{i}", 4, max_tokens=100, bad_words=["x"] if i == 3 else []))
    scheduler.add_request(make_request("r4", 20))
    s1 = scheduler.schedule()
    assert not s1.pending_constrained_output  # r3 has nothing in flight yet
    s2 = scheduler.schedule()
    apply(scheduler, s1, {f"r{i}": [1] for i in range(4)})
    return scheduler, s2


def test_update_draft_token_ids_in_output_trims_pads_skips_and_replaces():
    """Invariant 12: the scheduled count never changes; the invalid tail is padded with -1 and counted."""
    scheduler, so = deferred_step()
    assert so.pending_constrained_output and "r4" not in so.scheduled_spec_decode_tokens
    counts = dict(so.num_scheduled_tokens)
    drafts = {
        "r0": [1, 2, 3, 4, 5],  # trimmed to the 3 slots
        "r1": [7],  # padded
        "r2": [4, -1, 6],  # cut at the first -1 (a draft the drafter could not make)
        "r3": [13, 2, 2],  # constrained: the validator refuses 13
        "r4": [9, 9, 9],  # a prefill chunk has no slots: skipped
        "gone": [1],  # not scheduled: skipped
    }
    scheduler.update_draft_token_ids_in_output(drafts, so)
    assert so.scheduled_spec_decode_tokens == {
        "r0": [1, 2, 3],
        "r1": [7, -1, -1],
        "r2": [4, -1, -1],
        "r3": [-1, -1, -1],
    }
    assert so.num_invalid_spec_tokens == {"r1": 2, "r2": 2, "r3": 3}
    assert so.num_scheduled_tokens == counts


def test_validator_sees_only_constrained_requests_and_must_stay_in_range():
    seen = []

    def validator(request, drafts):
        seen.append((request.request_id, drafts))
        return len(drafts) + 1

    scheduler, so = deferred_step(validator)
    with pytest.raises(SchedulerInvariantError, match="draft_validator kept 4 of 3"):
        scheduler.update_draft_token_ids_in_output({f"r{i}": [5, 5, 5] for i in range(4)}, so)
    assert seen == [("r3", [5, 5, 5])]


def test_invalid_drafts_count_as_rejected_and_are_left_out_of_stats():
    """Invariants 12 and 13: pads are rejected positions; accepting one is refused."""
    scheduler, so = deferred_step()
    scheduler.update_draft_token_ids_in_output(
        {"r0": [1, 2, 3], "r1": [7], "r2": [1, 2, 3], "r3": [1, 13]}, so
    )
    r1 = scheduler.requests["r1"]
    out = apply(scheduler, so, {"r0": [1, 2, 3, 4], "r1": [7, 8], "r2": [5], "r3": [1, 6]})
    assert r1.num_computed_tokens - r1.num_output_placeholders == r1.num_tokens - 1
    assert r1.spec_decoding_stats.num_draft_tokens == 1 and r1.spec_decoding_stats.num_accepted_tokens == 1
    stats = out.spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (
        4,
        3 + 1 + 3 + 1,
        3 + 1 + 0 + 1,
    )

    scheduler, so = deferred_step()
    scheduler.update_draft_token_ids_in_output({"r1": [7]}, so)
    with pytest.raises(SchedulerInvariantError, match="accepted 2 of 1 drafts"):
        apply(scheduler, so, {"r1": [7, 8, 9]})


def test_depth2_keeps_the_seat_of_a_request_finishing_in_flight():
    """Depth 2 plans frame n+1 before frame n returns, so a request that frame n finishes still holds its
    seat and its share of the budget in frame n+1 (those tokens are discarded), and a waiting request is
    admitted one frame later than under sync. That is why async arms verify drafts at other positions
    than sync arms, and why the oracle compares drafts position by position."""
    scheduler = make_scheduler(async_scheduling=True, k=K, max_num_seqs=2)
    short, long, waiting = (make_request(r, 4, max_tokens=n) for r, n in (("a", 3), ("b", 100), ("c", 100)))
    for request in (short, long, waiting):
        scheduler.add_request(request)
    apply(scheduler, scheduler.schedule(), {"a": [1], "b": [1]})
    s2 = scheduler.schedule()
    s3 = scheduler.schedule()  # planned before s2 returns: "a" may or may not finish in s2
    assert s3.num_scheduled_tokens == {"a": 1 + K, "b": 1 + K}
    apply(scheduler, s2, {"a": [7] * (1 + K), "b": [7]})
    assert short.status == RequestStatus.FINISHED_LENGTH_CAPPED
    s4 = scheduler.schedule()  # planned before s3 returns, as depth 2 does; sync would admit "c" in s3
    assert set(s4.num_scheduled_tokens) == {"b", "c"}
    out = apply(scheduler, s3, {"b": [7]})
    assert [o.req_id for o in out.outputs] == ["b"]  # the frame's share for "a" was discarded


def test_a_real_draft_of_token_id_0_is_not_a_pad():
    """Token id 0 is a real token; only negative ids are pads (-1). The deferred branch must keep a 0
    draft, in an unconstrained request and past the validator of a constrained one."""
    scheduler, so = deferred_step()
    scheduler.update_draft_token_ids_in_output({"r0": [0, 0, 0], "r1": [5, 0], "r3": [0, 2, 0]}, so)
    assert so.scheduled_spec_decode_tokens == {
        "r0": [0, 0, 0],
        "r1": [5, 0, -1],
        "r2": [-1, -1, -1],
        "r3": [0, 2, 0],
    }
    assert so.num_invalid_spec_tokens == {"r1": 1, "r2": 3}


def test_a_step_whose_drafts_are_all_pads_is_not_a_drafting_step():
    """vllm:spec_decode_num_drafts counts verify steps that carried at least one real draft: a request
    whose slots were all padded (no draft, or every draft invalid) verified nothing."""
    scheduler, so = deferred_step()
    scheduler.update_draft_token_ids_in_output({"r0": [1, 2, 3], "r3": [13, 2, 2]}, so)  # r1, r2: none
    assert so.num_invalid_spec_tokens == {"r1": 3, "r2": 3, "r3": 3}
    out = apply(scheduler, so, {"r0": [1, 2, 9], "r1": [5], "r2": [5], "r3": [5]})
    stats = out.spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 2)
    assert scheduler.spec_decoding_stats.num_drafts == 1
    assert [scheduler.requests[f"r{i}"].spec_decoding_stats.num_drafts for i in range(4)] == [1, 0, 0, 0]


def test_stale_requests_passed_over_keep_their_order_at_the_front():
    """Invariant 9 lets a later request pass preempted ones whose stale output is still in flight; the
    passed-over requests stay at the front of the queue in their own order (b before c: b was admitted
    first), so FCFS resumes when their output drains."""
    scheduler = make_scheduler(async_scheduling=True, block_size=1, num_blocks=13, max_model_len=12, max_num_seqs=3)
    for req_id in "abcd":
        scheduler.add_request(make_request(req_id, 3, max_tokens=20))
    apply(scheduler, scheduler.schedule(), {"a": [1], "b": [1], "c": [1]})
    frames = [scheduler.schedule() for _ in range(5)]
    assert [set(f.preempted_req_ids) for f in frames] == [set(), {"c"}, set(), {"b"}, set()]
    assert frames[-1].num_scheduled_tokens == {"a": 1, "d": 3}  # d passed the stale b and c
    assert [(r.request_id, r.num_stale_output_tokens > 0) for r in scheduler.waiting] == [("b", True), ("c", True)]


@pytest.mark.parametrize(
    "drafts, valid",
    [
        ([4, 2, 9], 3),
        ([2, 3, 4], 1),  # 3 after 2 completes the banned [2, 3]
        ([3, 4], 0),  # the committed history ends with 2
        ([6, 2, 3], 2),
        ([5, 8], 0),  # a one-token banned word
    ],
)
def test_valid_draft_prefix_reads_the_drafts_before_each_draft(drafts, valid):
    request = Request("r", [1, 2], SamplingParams(bad_words_token_ids=[[2, 3], [5]]))
    assert valid_draft_prefix(request, drafts) == valid
