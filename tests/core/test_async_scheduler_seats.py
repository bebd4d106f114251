"""AsyncScheduler decisions with frames in flight: a request whose output is complete in flight gives
its turn to the next one, drafts fill the placeholders of the requests still alive, and the exact
errors for what the async path refuses. Invariant numbers refer to docs/invariants.md."""

import pytest

from refengine.core.scheduler import SchedulerInvariantError
from refengine.request import RequestStatus

from .harness import make_request, make_scheduler, runner_output


def test_request_done_in_flight_does_not_block_the_next_one():
    # a wants 1 token and its prefill frame will deliver it, so a gets nothing next step (invariant 7);
    # the scheduler must still go on to b and c behind it.
    scheduler = make_scheduler(async_scheduling=True)
    scheduler.add_request(make_request("a", 4, max_tokens=1))
    scheduler.add_request(make_request("b", 4, max_tokens=5))
    scheduler.add_request(make_request("c", 4, max_tokens=5))
    assert scheduler.schedule().num_scheduled_tokens == {"a": 4, "b": 4, "c": 4}
    assert scheduler.schedule().num_scheduled_tokens == {"b": 1, "c": 1}


def test_drafts_fill_placeholders_after_an_earlier_request_finished():
    scheduler = make_scheduler(async_scheduling=True, k=2)
    scheduler.add_request(make_request("a", 4))
    scheduler.add_request(make_request("b", 4))
    scheduler.schedule()
    so = scheduler.schedule()
    assert so.scheduled_spec_decode_tokens == {"a": [-1, -1], "b": [-1, -1]}
    # a is aborted while this frame waits for its drafts; b's slots must still get its real drafts.
    scheduler.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    scheduler.update_draft_token_ids_in_output({"a": [5, 6], "b": [7, 0]}, so)
    assert so.scheduled_spec_decode_tokens == {"a": [-1, -1], "b": [7, 0]}
    assert so.num_invalid_spec_tokens == {}


def test_sync_draft_entry_point_is_refused_with_its_reason():
    scheduler = make_scheduler(async_scheduling=True, k=2)
    with pytest.raises(
        SchedulerInvariantError,
        match=r"^async scheduling keeps -1 placeholders; drafts reach it only via "
        r"update_draft_token_ids_in_output$",
    ):
        scheduler.update_draft_token_ids({"a": [1]})


def test_a_token_from_a_chunk_cannot_release_placeholders():
    # A chunk gets no placeholders (invariant 3), so a token delivered for it would release one that
    # was never taken.
    scheduler = make_scheduler(async_scheduling=True, max_num_batched_tokens=4)
    scheduler.add_request(make_request("a", 6))
    so = scheduler.schedule()
    with pytest.raises(SchedulerInvariantError, match="output placeholders went negative$"):
        scheduler.update_from_output(so, runner_output(so, {"a": [9]}))
