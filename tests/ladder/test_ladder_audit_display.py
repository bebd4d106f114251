"""Client self-audit and the console display."""

import asyncio
import io
import time

from rich.console import Console

from ladder.audit import Audit, AuditProbe, AuditThresholds
from ladder.display import Display, rung_line
from ladder.records import RequestRecord
from ladder.rung import RungNotRun, RungVoid


def test_lag_with_client_cpu_is_client_bound_and_lag_without_it_is_host_contention():
    t = AuditThresholds(max_cpu_pct=90.0, max_loop_lag_ms=10.0)
    assert Audit(cpu_pct=99.0, loop_lag_p99_ms=10.0, dispatch_lag_p99_ms=50.0, thresholds=t).flag is None
    assert Audit(cpu_pct=90.5, loop_lag_p99_ms=10.5, dispatch_lag_p99_ms=0.0, thresholds=t).flag == "CLIENT_BOUND"
    contended = Audit(cpu_pct=3.0, loop_lag_p99_ms=25.0, dispatch_lag_p99_ms=0.0, thresholds=t)
    assert contended.flag == "HOST_CONTENTION"
    assert contended.criterion == "event-loop lag p99 25.0 ms > 10 ms, client CPU 3% of a core <= 90%"
    # the thresholds are flags: a lower CPU bar turns the same numbers into CLIENT_BOUND
    assert Audit(3.0, 25.0, 0.0, AuditThresholds(max_cpu_pct=2.0)).flag == "CLIENT_BOUND"


def test_a_blocked_event_loop_and_late_dispatch_show_in_the_audit():
    """Every bound here holds however loaded the machine is: a busy loop makes the sleep probe wake at
    least ~30 ms late (load only makes it later), and the CPU share comes from injected clocks."""
    clock = iter([0.0, 2.0])  # 2 s of wall time ...
    cpu = iter([10.0, 11.5])  # ... of which 1.5 s on the CPU

    async def blocked() -> Audit:
        probe = AuditProbe(cpu_clock=lambda: next(cpu), wall_clock=lambda: next(clock))
        for _ in range(5):
            await asyncio.sleep(0.01)
            end = time.perf_counter() + 0.03
            while time.perf_counter() < end:  # the loop is busy: the sleep probe wakes ~30 ms late
                pass
        records = [RequestRecord(1, "measured", i, t_due=1.0, t_send=1.0 + 0.002 * i) for i in range(5)]
        return probe.stop(records + [RequestRecord(1, "measured", 9)])  # never sent: ignored

    audit = asyncio.run(blocked())
    assert audit.loop_lag_p99_ms > 10
    assert 7.5 < audit.dispatch_lag_p99_ms < 8.0  # p99 of 0, 2, 4, 6, 8 ms
    assert audit.cpu_pct == 75.0 and audit.flag == "HOST_CONTENTION"


def test_live_display_on_a_terminal_and_plain_lines_elsewhere():
    for terminal in (True, False):
        buf = io.StringIO()
        now = [0.0]
        display = Display(Console(file=buf, force_terminal=terminal, width=200), explain=True,
                          clock=lambda now=now: now[0])
        display.start(2)
        display.phase_start("c=4", "measured", 3)
        for i, t in enumerate((1.0, 12.0, 13.0)):  # 12 s in: one plain line is due off a terminal
            now[0] = t
            rec = RequestRecord(4, "measured", i, t_send=t - 0.5, chunk_times=[t - 0.25, t], completion_tokens=2,
                                done=True)
            display.request_done(rec, failed=i == 2)
        display.phase_end()
        display.rung_end(RungVoid(4, 1, 1, "http_error", ("http_error: HTTP 500: x",), "h"))
        display.rung_end(RungNotRun(8, "engine_dead: stall"))
        display.finish()
        text = buf.getvalue()
        assert "c=4    VOID    ok=1 failed=1  http_error  (http_error: HTTP 500: x)" in text
        assert "c=8    NOT_RUN engine_dead: stall" in text and "tpot_ms" in text
        assert "latency per rung, ms: p50 / p90 / p99" in text and "E2E" in text  # the end table
        assert ("━" in text) == terminal  # the progress bar exists only on a terminal
        plain = "rung 1/2 c=4 measured: 2/3 done  0 failed  0.3 out tok/s  ttft p50 250 ms"
        assert (plain in text) != terminal  # one plain line after 10 s, only off a terminal
        assert text.count("/3 done") == (0 if terminal else 1)


def test_the_median_label_is_never_put_on_a_mean():
    from ladder.display import _mid
    from ladder.metrics import Summary

    assert _mid(Summary(mean=3.0, percentiles={"p99.9": 9.0})) == "mean 3.0"
    assert _mid(Summary(mean=3.0, percentiles={"p50": 2.0})) == "p50 2.0"


def test_rung_line_never_prints_numbers_for_void():
    line = rung_line(RungVoid(2, 0, 3, "engine_dead: canary failed", (), "h"))
    assert line == "c=2    VOID    ok=0 failed=3  engine_dead: canary failed"
