"""Sync scheduling under KV pressure: which request is preempted at which step, the exact preemption
counters, and abort freeing blocks for re-admission. Block size 4 and 4 blocks: three prompts of 4
fill three blocks, and every later block is contested (max_model_len 16 keeps one sequence within
the 4 blocks)."""

import pytest

from refengine.core.scheduler import SchedulerInvariantError
from refengine.request import RequestStatus

from .harness import make_request, make_scheduler, runner_output


def step(scheduler, rows):
    so = scheduler.schedule()
    return so, scheduler.update_from_output(so, runner_output(so, rows))


def test_newest_request_is_preempted_each_time_and_counted():
    scheduler = make_scheduler(block_size=4, num_blocks=4, max_model_len=16)
    assert scheduler.num_preemptions == 0
    a, c, b = (make_request(r, 4, max_tokens=10) for r in "acb")
    for request in (a, c, b):
        scheduler.add_request(request)

    so, _ = step(scheduler, {"a": [1], "c": [1], "b": [1]})
    assert (
        so.num_scheduled_tokens == {"a": 4, "c": 4, "b": 4}
        and scheduler.kv_cache_manager.num_free_blocks == 1
    )

    # 5 slots each: a takes the last free block, c needs one more and b, the newest, gives up its own.
    so, _ = step(scheduler, {"a": [2], "c": [2]})
    assert so.num_scheduled_tokens == {"a": 1, "c": 1} and so.preempted_req_ids == {"b"}
    assert (b.status, b.num_preemptions, scheduler.num_preemptions) == (RequestStatus.PREEMPTED, 1, 1)

    # The abort frees c's two blocks: b comes back with its 5 tokens (prompt and its one output).
    scheduler.finish_requests(["c"], RequestStatus.FINISHED_ABORTED)
    assert c.status == RequestStatus.FINISHED_ABORTED
    so, _ = step(scheduler, {"a": [3], "b": [2]})
    assert so.num_scheduled_tokens == {"a": 1, "b": 5} and so.finished_req_ids == {"c"}
    assert scheduler.kv_cache_manager.num_free_blocks == 0

    for token in (4, 5):
        so, _ = step(scheduler, {"a": [token], "b": [token]})
        assert so.num_scheduled_tokens == {"a": 1, "b": 1} and not so.preempted_req_ids

    # a's 9th slot needs a third block: b, newest again, is preempted a second time.
    so, _ = step(scheduler, {"a": [6]})
    assert so.num_scheduled_tokens == {"a": 1} and so.preempted_req_ids == {"b"}
    assert (b.num_preemptions, a.num_preemptions, scheduler.num_preemptions) == (2, 0, 2)


def test_preempting_a_request_with_stale_output_is_refused_by_name():
    """Invariant 9 (docs/invariants.md): a running request has no stale output left (it was re-admitted only once that drained);
    a counter that says otherwise stops the scheduler instead of recomputing on top of it."""
    scheduler = make_scheduler(block_size=4, num_blocks=4, max_model_len=16)
    a, c, b = (make_request(r, 4, max_tokens=10) for r in "acb")
    for request in (a, c, b):
        scheduler.add_request(request)
    step(scheduler, {"a": [1], "c": [1], "b": [1]})
    b.num_stale_output_tokens = 1  # corrupted: b is the next victim
    with pytest.raises(SchedulerInvariantError, match=r"^Request\('b', RUNNING, .*\): preempted while stale output is in flight$"):
        scheduler.schedule()
