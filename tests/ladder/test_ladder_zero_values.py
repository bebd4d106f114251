"""`ladder run` flags whose 0 means something (the table in tests/cli/test_zero_and_limits.py), end to
end against the scripted fake server: --warmup 0 sends no warmup request; --client-bound-lag-ms 0 and
--client-bound-cpu-pct 0 flag a rung for any event-loop lag and any client CPU."""

from ladder_harness import load_records, load_rungs


def test_zero_warmup_and_zero_audit_thresholds(fake_server, ladder):
    code, out, err, run = ladder(
        "--base-url", fake_server(), "--c", "1,2", "--input-len", "16", "--output-len", "4",
        "--prompts-per-concurrency", "2", "--warmup", "0", "--client-bound-lag-ms", "0", "--client-bound-cpu-pct", "0",
    )
    assert code == 0, (out, err)
    assert [r["phase"] for r in load_records(run)] == ["measured"] * 6
    for rung in load_rungs(run):
        # A sleep probe always wakes a little late and the client always spends some CPU.
        assert rung["audit"]["flag"] == "CLIENT_BOUND", rung["audit"]
