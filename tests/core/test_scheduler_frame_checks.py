"""Scheduler.update_from_output frame by frame: what a step delivers, and the frames (and requests)
the scheduler refuses with a named error instead of applying them half or twice."""

import pytest

from refengine.core.outputs import ModelRunnerOutput
from refengine.core.scheduler import SchedulerInvariantError

from .harness import make_request, make_scheduler, runner_output


def step(scheduler, rows):
    so = scheduler.schedule()
    return so, scheduler.update_from_output(so, runner_output(so, rows))


def test_running_request_cannot_be_added_again():
    scheduler = make_scheduler()
    request = make_request("a", 4)
    scheduler.add_request(request)
    scheduler.schedule()
    with pytest.raises(ValueError, match="^request 'a' is RUNNING, not WAITING$"):
        make_scheduler().add_request(request)


def test_chunk_steps_deliver_no_output():
    # A prefill chunk samples nothing: the step reports no output at all for it, not an empty one.
    scheduler = make_scheduler(max_num_batched_tokens=4)
    scheduler.add_request(make_request("a", 6, max_tokens=3))
    so, out = step(scheduler, {})
    assert so.num_scheduled_tokens == {"a": 4}
    assert out.outputs == () and out.finished_req_ids == frozenset()
    so, out = step(scheduler, {"a": [9]})
    assert so.num_scheduled_tokens == {"a": 2}
    assert [(o.req_id, o.new_token_ids, o.finish_reason) for o in out.outputs] == [("a", (9,), None)]


def test_runner_output_with_more_rows_than_ids_is_refused():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", 4))
    so = scheduler.schedule()
    with pytest.raises(ValueError, match="zip"):
        scheduler.update_from_output(so, ModelRunnerOutput(["a"], [[1], [2]]))


def test_a_frame_applied_twice_is_refused():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", 4))
    so = scheduler.schedule()
    scheduler.update_from_output(so, runner_output(so, {"a": [1]}))
    with pytest.raises(SchedulerInvariantError, match="in-flight counters went negative$"):
        scheduler.update_from_output(so, runner_output(so, {"a": [1]}))


def test_a_token_from_a_prefill_chunk_is_refused():
    # The chunk ends before the last prompt token, so a sampled token there would sit at a prompt
    # position: the KV would no longer cover all tokens but the last.
    scheduler = make_scheduler(max_num_batched_tokens=4)
    scheduler.add_request(make_request("a", 6))
    so = scheduler.schedule()
    with pytest.raises(SchedulerInvariantError, match="nc - ph != nt - 1 after an update$"):
        scheduler.update_from_output(so, runner_output(so, {"a": [9]}))
