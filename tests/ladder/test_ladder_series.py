"""Server metrics over time: /metrics scraped during each rung's measured phase, on the scripted server
whose requests are held open for a scripted time. Counts of samples only; no wall-time assertion."""

import json
import math

import pytest
from ladder_harness import fake_cmd, load_records, load_rungs

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
        # the gauges' mean is over the requests' own window: tick 0 and the closing sample read an idle server
        sent = [r for r in load_records(run) if r["concurrency"] == rung["concurrency"] and r["phase"] == "measured"]
        lo, hi = min(r["t_send"] for r in sent), max(r["t_end"] for r in sent)
        inside = [s["values"]["running"] for s in mine if lo <= s["t"] <= hi]
        assert len(inside) < len(running) and series["running"]["mean"] == pytest.approx(sum(inside) / len(inside))
        assert series["waiting"] == {"mean": 0.0, "peak": 0.0}
        assert series["kv_usage"] is None and series["prefix_cache_hit_rate"] is None  # not exposed: n/a
    by_c = {r["concurrency"]: r["server_metrics"]["series"]["preemptions"] for r in rungs}
    assert by_c[1]["peak"] == 0 and by_c[2]["peak"] == 1


VLLM = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:num_requests_running{{engine="1",model_name="m"}} 1
vllm:kv_cache_usage_perc{{model_name="m"}} 0.5
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{model_name="m"}} {preempted}
vllm:num_preemptions_created{{model_name="m"}} 1.7e9
vllm:prefix_cache_queries_total{{model_name="m"}} {queries}
vllm:prefix_cache_hits_total{{model_name="m"}} {hits}
vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {drafted}
vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {accepted}
"""
SGLANG = """sglang:num_running_reqs{model_name="m",tp_rank="0"} 3
sglang:num_queue_reqs{model_name="m"} 2
sglang:token_usage{model_name="m"} 0.25
sglang:cache_hit_rate{model_name="m"} 0.5
sglang:spec_accept_rate{model_name="m"} 0.55
sglang:spec_accept_length{model_name="m"} 1.55
"""


def _summary(*texts: str) -> dict:
    from ladder import scrape

    samples = [scrape.Sample(i, float(i), scrape.reading(scrape.parse(t))) for i, t in enumerate(texts)]
    return scrape.summary(scrape.Series(1.0, 0.0, 2.0, samples))["series"]


def test_vllm_counters_become_per_interval_series_and_gauges_sum_over_engines():
    series = _summary(VLLM.format(running=2, preempted=5, queries=100, hits=10, drafted=30, accepted=6),
                      VLLM.format(running=4, preempted=7, queries=200, hits=90, drafted=60, accepted=30))
    assert series["running"] == {"mean": 4.0, "peak": 5.0}  # two engines' gauges summed: 3, then 5
    assert series["kv_usage"] == {"mean": 0.5, "peak": 0.5}
    assert series["preemptions"] == {"mean": 2.0, "peak": 2.0}  # the increase, not the total
    assert series["prefix_cache_hit_rate"] == {"mean": 0.8, "peak": 0.8}  # 80 hits of 100 queries
    assert series["spec_acceptance_rate"] == {"mean": 0.8, "peak": 0.8}  # 24 of 30 drafts
    assert series["waiting"] is None and series["spec_accept_length"] is None  # not exposed: n/a


def test_sglang_names_and_a_server_without_metrics():
    series = _summary(SGLANG)
    assert series["running"]["peak"] == 3 and series["waiting"]["peak"] == 2 and series["kv_usage"]["peak"] == 0.25
    assert series["prefix_cache_hit_rate"]["peak"] == 0.5 and series["spec_acceptance_rate"]["peak"] == 0.55
    assert series["spec_accept_length"]["peak"] == 1.55 and series["preemptions"] is None
    assert all(v is None for v in _summary("not a Prometheus text {", "").values())
