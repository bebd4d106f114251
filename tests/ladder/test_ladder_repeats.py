"""--repeats: the interval arithmetic, and a VOID repeat voiding its rung on the scripted server."""

import math

import pytest
from ladder_harness import load_records, load_rungs

from ladder import host
from ladder.repeats import interval


def test_interval_is_students_t_over_the_sample_sd():
    ci = interval([100.0, 110.0, 120.0])
    half = 4.303 * 10.0 / math.sqrt(3)  # t(0.975, 2 df) · s / √n, s the sample (n - 1) sd
    assert ci["mean"] == 110.0 and ci["half_width"] == pytest.approx(half)
    assert ci["ci95"] == pytest.approx([110.0 - half, 110.0 + half])
    assert ci["cv"] == pytest.approx(10.0 / 110.0)
    assert interval([5.0])["ci95"] is None  # one repeat has no interval


def test_a_void_repeat_voids_the_rung_and_ends_it(fake_server, ladder):
    # serials: repeat 0 = 0 1, repeat 1 = 2 3 (3 fails), repeat 2 never runs
    url = fake_server(fail_at=[3])
    code, out, err, run = ladder("--base-url", url, "--c", "1", "--prompts-per-rung", "2", "--warmup", "0",
                                 "--output-len", "3", "--repeats", "3")
    assert code == 1, (out, err)
    (rung,) = load_rungs(run)
    assert rung["status"] == "VOID" and "http_error" in rung["reason"]
    assert [r["repeat"] for r in load_records(run)] == [0, 0, 1, 1]  # every request kept; no repeat 2


def test_overloaded_means_more_runnable_work_than_cores():
    assert host.overloaded({"1m": 2.0}, 2) is False
    assert host.overloaded({"1m": 2.5}, 2) is True
    assert host.overloaded(None, 2) is None
