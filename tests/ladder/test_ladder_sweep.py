"""`ladder sweep`: doubling then bisection to the highest load meeting the SLOs. The search itself on a
scripted predicate (exact points), and the command end to end on the scripted server whose capacity cliff
is at a known concurrency."""

import asyncio
import json

import pytest
from ladder_harness import fake_cmd, load_rungs

from ladder.search import highest


def _search(capacity: float, limit: float, integer: bool = True):
    async def passes(load):
        return load <= capacity
    return asyncio.run(highest(passes, 1, limit, integer))


@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 7, 8, 100, 256])
def test_search_finds_the_exact_capacity(capacity):
    result = _search(capacity, 256)
    assert result.answer == capacity
    passed = [load for load, ok in result.tried if ok]
    failed = [load for load, ok in result.tried if not ok]
    # the evidence: the answer passed, and its neighbour above failed (or is the limit)
    assert max(passed) == capacity and (capacity == 256 or capacity + 1 in failed)


def test_search_doubles_then_bisects():
    assert [load for load, _ in _search(5, 256).tried] == [1, 2, 4, 8, 6, 5]
    assert _search(0, 256).answer is None and _search(0, 256).tried == [(1, False)]
    assert _search(1000, 100).tried[-1] == (100, True)  # the limit itself is tried, never passed over


def test_rate_search_ends_within_the_resolution():
    result = _search(3.3, 64, integer=False)
    assert 3.3 * 0.95 <= result.answer <= 3.3


def test_sweep_finds_the_scripted_capacity(tmp_path, capsys):
    """The scripted server holds each request 0.2 s, and once more than 3 are in flight at once it answers
    every request 1 s late until it drains: with a TTFT SLO of 700 ms the answer is exactly c = 3."""
    from ladder.cli import main

    out = tmp_path / "sweep"
    script = {"ttft": 0.2, "slow_above": 3, "slow_ttft": 1.0}
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "--serve-cmd", fake_cmd(script, "{port}"), "--goodput", "ttft:700", "--max-c", "16",
              "--output-len", "3", "--prompts-per-concurrency", "2", "--slo-attainment", "1", "--out", str(out)])
    text = capsys.readouterr().out
    assert exc.value.code == 0, text
    result = json.loads((out / "sweep.json").read_text())
    assert result["answer"] == 3
    assert [(p["load"], p["passed"]) for p in result["points"]] == [(1, True), (2, True), (4, False), (3, True)]
    assert "highest c meeting ttft:700 (ms)" in text and ": 3 concurrent requests" in text
    rungs = {r["concurrency"]: r for r in load_rungs(out)}
    assert sorted(rungs) == [1, 2, 3, 4] and all(r["status"] == "OK" for r in rungs.values())
    assert rungs[3]["stats"]["goodput_fraction"] == 1.0 and rungs[4]["stats"]["goodput_fraction"] < 1.0
    assert json.loads((out / "manifest.json").read_text())["sweep"]["answer"] == 3


def test_sweep_needs_slos(tmp_path, capsys):
    from ladder.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["sweep", "--base-url", "http://127.0.0.1:9", "--max-c", "4", "--out", str(tmp_path / "x")])
    assert exc.value.code == 2 and "--goodput" in capsys.readouterr().err
