"""Open-loop arrival schedules, with an injected clock: no assertion depends on the machine's speed."""

import asyncio

import numpy as np
import pytest

from ladder import arrivals


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize("burstiness, cv", [(1.0, 1.0), (4.0, 0.5), (0.25, 2.0)])
def test_gamma_arrivals_have_the_asked_mean_rate_and_spread(burstiness, cv):
    due = arrivals.due_times(4001, rate=4.0, burstiness=burstiness, seed=0)
    gaps = np.diff(due)
    assert due[0] == 0.0 and len(due) == 4001
    # 4,000 intervals: the mean's standard error is cv/sqrt(4000) = 1.6% of it; the bounds are 4-5 sigma
    assert abs(gaps.mean() - 0.25) < 0.25 * 0.07 * cv
    assert abs(gaps.std() / gaps.mean() - cv) < 0.1 * cv
    assert due == arrivals.due_times(4001, rate=4.0, burstiness=burstiness, seed=0)  # seeded


def test_requests_go_out_on_schedule_with_a_fast_sender():
    clock = FakeClock()
    due = arrivals.due_times(50, rate=10.0, burstiness=1.0, seed=1)
    sent = []

    async def send(i: int, t_due: float) -> None:
        sent.append(clock())

    assert asyncio.run(arrivals.dispatch(due, send, clock, clock.sleep)) == 50
    late = arrivals.lateness(due, sent)
    assert late.num_late == 0 and late.max_ms == pytest.approx(0.0, abs=1e-9)


def test_a_slow_sender_is_flagged_late():
    clock = FakeClock()
    due = [0.1 * i for i in range(20)]  # one request every 100 ms
    sent = []

    async def slow_send(i: int, t_due: float) -> None:
        sent.append(clock())
        clock.now += 0.15  # each send blocks the client for 150 ms: it falls further behind every time

    asyncio.run(arrivals.dispatch(due, slow_send, clock, clock.sleep))
    late = arrivals.lateness(due, sent)
    assert late.num_late == 19  # all but the first
    assert late.max_ms == pytest.approx(19 * 50.0)


def test_max_duration_stops_sending():
    clock = FakeClock()
    due = [float(i) for i in range(10)]

    async def send(i: int, t_due: float) -> None:
        pass

    assert asyncio.run(arrivals.dispatch(due, send, clock, clock.sleep, stop_after_s=4.5)) == 5


def test_inf_rate_sends_everything_at_once():
    assert arrivals.due_times(3, float("inf"), 1.0, 0) == [0.0, 0.0, 0.0]
