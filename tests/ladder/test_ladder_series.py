"""Server metrics over time: /metrics scraped during each rung's measured phase, on the scripted server
whose requests are held open for a scripted time. Counts of samples only; no wall-time assertion."""

import json
import math

from ladder_harness import fake_cmd, load_rungs

HOLD_S = 0.5
INTERVAL_S = 0.125  # 4 intervals per hold, exactly in binary


def _samples(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_metrics_series_has_one_sample_per_interval_and_belongs_to_its_rung(ladder):
    # serials: c=1 warmup 0, measured 1 2; c=2 warmup 3, measured 4 5. The warmups' preemptions must not
    # show in their rungs' summaries, the measured one (4) must: tick 0 of the measured phase comes after the
    # warmup ended, its closing sample after request 4 ended.
    script = {"slow_at": list(range(6)), "slow_ttft": HOLD_S, "preempt_at": [0, 3, 4]}  # load requests held
    code, out, err, run = ladder("--serve-cmd", fake_cmd(script, "{port}"), "--c", "1,2", "--prompts-per-rung", "2",
                                 "--warmup", "1", "--output-len", "3", "--metrics-interval", str(INTERVAL_S))
    assert code == 0, (out, err)
    rungs = load_rungs(run)
    samples = _samples(run)
    assert {s["phase"] for s in samples} == {"warmup", "measured"}
    for rung in rungs:
        mine = [s for s in samples if s["concurrency"] == rung["concurrency"] and s["phase"] == "measured"]
        ticks = [s["tick"] for s in mine if s["tick"] is not None]
        summary = rung["server_metrics"]
        # one sample per interval: ticks taken + ticks skipped (a late scrape) = the intervals the phase lasted
        assert len(ticks) + summary["num_skipped"] == summary["num_ticks"]
        assert ticks == sorted(set(ticks)) and ticks[0] == 0
        assert abs(summary["num_ticks"] - (math.floor(summary["duration_s"] / INTERVAL_S) + 1)) <= 1
        # the phase held its requests HOLD_S each (c = 1: two in turn; c = 2: two at once), so it lasted at
        # least that many intervals, and had a tick for each
        waves = 2 // rung["concurrency"]
        assert summary["num_ticks"] >= waves * HOLD_S / INTERVAL_S
        assert [s["tick"] for s in mine].count(None) == 1  # the closing sample
        running = [s["values"]["running"] for s in mine]
        series = summary["series"]
        assert series["running"]["peak"] == max(running) <= rung["concurrency"]
        assert series["running"]["mean"] == sum(running) / len(running)
        assert series["waiting"] == {"mean": 0.0, "peak": 0.0}
        assert series["kv_usage"] is None and series["prefix_cache_hit_rate"] is None  # not exposed: n/a
    by_c = {r["concurrency"]: r["server_metrics"]["series"]["preemptions"] for r in rungs}
    assert by_c[1]["peak"] == 0 and by_c[2]["peak"] == 1
