"""Load that proves itself, against the scripted server: a closed-loop rung records its steady in-flight
count and an open-loop rung its achieved rate and the fit of its arrivals; a client that holds requests back
is flagged LOAD_MISS, a normal run is not."""

import asyncio

import numpy as np
from ladder_harness import load_rungs

from ladder import client, load_check

FAKE = {"ttft": 0.05, "gap": 0.005}
ARGS = ("--input-len", "64", "--output-len", "8", "--warmup", "0", "--prompts-per-rung", "16")


def test_a_normal_closed_loop_rung_delivers_c(fake_server, ladder):
    code, out, err, run = ladder("--base-url", fake_server(**FAKE), "--c", "4", *ARGS)
    assert code == 0, (out, err)
    (rung,) = load_rungs(run)
    load = rung["delivered_load"]
    assert load["configured"] == 4 and load["mean_in_flight"] >= 0.9 * 4 and load["min_in_flight"] >= 3
    assert load["missed"] is None and "LOAD_MISS" not in rung["flags"]


def test_a_client_that_holds_requests_back_is_flagged(fake_server, ladder, monkeypatch):
    """Each request waits 60 ms in the client before it is sent, against ~90 ms of service: about a third of
    the c slots sit empty, and the rung says it did not measure c."""
    send = client.stream

    async def held_back(*args, **kwargs):
        await asyncio.sleep(0.06)
        await send(*args, **kwargs)

    monkeypatch.setattr(client, "stream", held_back)
    code, out, err, run = ladder("--base-url", fake_server(**FAKE), "--c", "4", *ARGS)
    (rung,) = load_rungs(run)
    assert "LOAD_MISS" in rung["flags"], rung["delivered_load"]
    assert rung["delivered_load"]["mean_in_flight"] < 0.9 * 4
    assert "LOAD_MISS (mean in flight" in out


def test_an_open_loop_rung_fits_its_poisson_arrivals(fake_server, ladder):
    code, out, err, run = ladder("--base-url", fake_server(**FAKE), "--request-rate", "40", "--input-len", "64",
                                 "--output-len", "8", "--warmup", "0", "--prompts-per-rung", "40", "--seed", "1")
    assert code == 0, (out, err)
    (rung,) = load_rungs(run)
    load = rung["delivered_load"]
    assert load["configured"] == 40 and load["ks_pvalue"] > load_check.P_MIN and load["missed"] is None
    assert abs(load["achieved_rate"] / 40 - 1) < 0.5


def test_evenly_spaced_sends_do_not_fit_poisson_arrivals():
    """The fit bites: sends at exactly 1/rate apart have the configured rate but not its distribution."""
    sends = np.arange(200) / 40.0
    load = load_check.open_loop(40.0, 1.0, sends)
    assert abs(load.achieved_rate - 40) < 1e-9 and load.ks_pvalue < load_check.P_MIN and load.flag == "LOAD_MISS"
