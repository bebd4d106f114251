"""ladder compare with this issue's additions: two builds of one engine are not like-for-like unless
--same-build says so, the report names the builds, and it shows --repeats intervals and the server's
/metrics series (table and plot over time)."""
# ruff: noqa: F811 (the compare fixture is imported from test_ladder_compare and taken as a parameter)

import json
from dataclasses import replace

from run_fixtures import REFENGINE, ok, write_run
from test_ladder_compare import compare, rows  # noqa: F401

from ladder.repeats import combine
from refengine.version import build

V1, V2 = "specladder 0.1.0 (aaaaaaaaaaaa)", "specladder 0.1.0 (bbbbbbbbbbbb, dirty)"


def test_two_builds_of_one_engine_are_unlike_unless_same_build(tmp_path, compare):
    a = write_run(tmp_path, "a", [ok(1, 100.0)], engine={**REFENGINE, "engine_version": V1})
    b = write_run(tmp_path, "b", [ok(1, 100.0)], engine={**REFENGINE, "engine_version": V2})
    code, out, err = compare(a, b)
    assert code == 0 and f"> - engine_version: a = {V1}, b = {V2}" in out and "not like-for-like" in err
    code, out, err = compare(a, b, "--same-build")
    assert code == 0 and "not like-for-like" not in out + err
    assert f"Report by ladder, {build().describe()}." in out  # every report names its commit


def test_repeats_show_their_interval_and_cv(tmp_path, compare):
    repeats = [ok(1, 100.0), ok(1, 110.0), ok(1, 120.0)]
    run = write_run(tmp_path, "r", [combine(repeats)])
    code, out, _ = compare(run)
    # mean 110, sd 10: half-width 4.303 * 10 / sqrt(3) = 24.8, CV 9.1%
    assert rows(out, "output")[1] == ["110.0 ± 24.8 (n=3, CV 9.1%)"]


def test_server_metrics_are_tabulated_and_plotted(tmp_path, compare):
    series = {"running": {"mean": 1.5, "peak": 2.0}, "waiting": {"mean": 0.0, "peak": 0.0}, "kv_usage": None,
              "preemptions": {"mean": 0.25, "peak": 1.0}, "spec_acceptance_rate": None, "spec_accept_length": None,
              "prefix_cache_hit_rate": None, "gpu_util_pct": None, "gpu_mem_used_mib": None}
    metrics = {"interval_s": 0.5, "duration_s": 2.0, "num_ticks": 5, "num_skipped": 0, "series": series}
    run = write_run(tmp_path, "s", [replace(ok(1, 100.0), server_metrics=metrics)])
    (run / "metrics.jsonl").write_text("".join(json.dumps(
        {"concurrency": 1, "request_rate": None, "repeat": 0, "tick": i, "t": 0.5 * i,
         "values": {"running": i % 3, "waiting": 0}}) + "\n" for i in range(5)))
    plots = tmp_path / "plots"
    code, out, _ = compare(run, "--plots", plots)
    assert code == 0 and "### Server metrics over the measured phase (mean / peak)" in out
    assert "| running requests | 1 | 1.5 / 2.0 |" in out and "| KV cache usage (%) | 1 | n/a |" in out
    assert "GPU" not in out  # no GPU series anywhere: no GPU rows
    assert (plots / "server_metrics.png").read_bytes()[:4] == b"\x89PNG" and "(server metrics over time)" not in out
    assert "![server metrics over time]" in out
