"""Speed-ups with their spread (ladder.speedup), from two real --repeats ladders against the scripted server:
every cell carries the interval its repeats allow, a one-run rung says it has none, and the table says when
the load moved between the arms."""

from dataclasses import replace
from pathlib import Path

from ladder import speedup
from ladder.runs import load_runs

ARGS = ("--input-len", "64", "--output-len", "8", "--warmup", "0", "--prompts-per-rung", "2", "--c", "1")


def _runs(fake_server, ladder, repeats: str):
    dirs = []
    for gap in (0.012, 0.004):
        code, out, err, run = ladder("--base-url", fake_server(gap=gap), *ARGS, "--repeats", repeats,
                                     "--label", f"gap{gap}")
        assert code == 0, (out, err)
        dirs.append(Path(run))
    return load_runs(dirs)


def test_every_speedup_carries_the_interval_of_its_repeats(fake_server, ladder):
    base, arm = _runs(fake_server, ladder, "2")
    base_tpot = speedup.values(base.rungs[1], "tpot_ms.p50")
    arm_tpot = speedup.values(arm.rungs[1], "tpot_ms.p50")
    assert len(base_tpot) == len(arm_tpot) == 2
    s = speedup.speedup(base_tpot, arm_tpot)
    assert s.runs == 2 and s.low < s.ratio < s.high
    assert s.low == min(base_tpot) / max(arm_tpot) and s.high == max(base_tpot) / min(arm_tpot)
    table = speedup.table(base, [arm])
    assert f"| gap0.004 | {s.ratio:.2f}x ({s.low:.2f}-{s.high:.2f}, 2 runs) |" in table, table
    # the load at each arm's start and end, as the manifests recorded it
    def at(run, one):
        return replace(run, host={**run.host, "load_average": {"start": {"1m": one}, "end": {"1m": one}}})
    held = speedup.table(at(base, 1.0), [at(arm, 1.2)])
    assert "load moved" not in held and "The load held between arms" in held and "gap0.004 1.2 -> 1.2" in held, held
    moved = speedup.table(at(base, 1.0), [at(arm, 3.5)])
    assert "The load moved between arms" in moved and "gap0.004 3.5 -> 3.5" in moved, moved


def test_a_single_run_has_no_spread_and_says_so(fake_server, ladder):
    base, arm = _runs(fake_server, ladder, "1")
    assert "(1 run: no spread)" in speedup.table(base, [arm])
