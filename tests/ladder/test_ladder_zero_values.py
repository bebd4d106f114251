"""`ladder run` flags whose 0 means something (the table in tests/cli/test_zero_and_limits.py), end to
end against the scripted fake server: --warmup 0 sends no warmup request; --client-bound-lag-ms 0 and
--client-bound-cpu-pct 0 flag a rung for any event-loop lag and any client CPU; --metrics-interval 0 scrapes
nothing, --range-ratio 0 spreads no length, --top-k 0 and --request-seed 0 are sent."""

from ladder_harness import load_records, load_rungs


def test_zero_warmup_and_zero_audit_thresholds(fake_server, ladder):
    code, out, err, run = ladder(
        # gap: each phase lasts several of the audit's 5 ms probe ticks, so the loop lag is sampled at all
        "--base-url", fake_server(gap=0.02), "--c", "1,2", "--input-len", "40", "--output-len", "4",
        "--prompts-per-concurrency", "2", "--warmup", "0", "--client-bound-lag-ms", "0", "--client-bound-cpu-pct", "0",
    )
    assert code == 0, (out, err)
    assert [r["phase"] for r in load_records(run)] == ["measured"] * 6
    for rung in load_rungs(run):
        # A sleep probe always wakes a little late and the client always spends some CPU.
        assert rung["audit"]["flag"] == "CLIENT_BOUND", rung["audit"]


def test_zero_series_spread_top_k_and_request_seed(fake_server, ladder):
    # --metrics-interval 0 scrapes nothing; --range-ratio 0 gives every request exactly the asked lengths;
    # --top-k 0 and --request-seed 0 are sent as such (a server reads top_k 0 as off, seed 0 as a seed), not
    # dropped as "not given": the scripted server answers 400 to a request without them.
    url = fake_server(require={"top_k": 0, "seed": 0})
    code, out, err, run = ladder("--base-url", url, "--c", "2", "--prompts-per-rung", "4", "--warmup", "0",
                                 "--input-len", "40", "--output-len", "5", "--metrics-interval", "0",
                                 "--range-ratio", "0", "--top-k", "0", "--request-seed", "0")
    assert code == 0, (out, err)
    assert not (run / "metrics.jsonl").exists()
    records = load_records(run)
    assert [r["max_tokens"] for r in records] == [5] * 4
    assert len({r["prompt_tokens"] for r in records}) == 1
