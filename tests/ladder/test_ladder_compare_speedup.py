"""`ladder compare --baseline NAME`: a speed-up table (the baseline's TPOT over each run's, per c) with the
interval of the runs' repeats (ladder.speedup, the one implementation); a VOID or PARTIAL rung gets no number."""

import json
from dataclasses import replace

import pytest
from run_fixtures import ok, summary, void, write_run

from ladder import repeats
from ladder.cli import main
from ladder.content_types import ContentStats


@pytest.fixture
def compare(capsys):
    def run(*args: str):
        with pytest.raises(SystemExit) as exc:
            main(["compare", *map(str, args)])
        cap = capsys.readouterr()
        return exc.value.code, cap.out, cap.err
    return run


def _edit(run, c: int, **fields) -> None:
    """Give rung c of a fixture run what `ladder run` writes for --repeats or an interrupt."""
    path = run / "rungs.json"
    rows = json.loads(path.read_text())
    for row in rows:
        if row["concurrency"] == c:
            row.update(fields)
    path.write_text(json.dumps(rows))


def _repeats(*tpots: float) -> dict:
    return {"n": len(tpots), "metrics": {"tpot_ms.p50": {"n": len(tpots), "values": list(tpots)}}}


def speedup_rows(report: str) -> dict[str, list[str]]:
    section = report.split("## Speed-up against", 1)[1].split("\n## ", 1)[0]
    return {cells[0]: cells[1:] for line in section.splitlines() if line.startswith("| ")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}


def test_speedups_against_the_named_baseline_carry_their_spread(tmp_path, compare):
    off = write_run(tmp_path, "off", [ok(1, 100.0, tpot=20.0), ok(2, 180.0, tpot=20.0), ok(4, 300.0, tpot=20.0)])
    spec = write_run(tmp_path, "spec", [ok(1, 150.0, tpot=10.0), ok(2, 200.0, tpot=10.0), void(4)])
    _edit(off, 1, repeats=_repeats(19.0, 21.0))
    _edit(spec, 1, repeats=_repeats(9.0, 11.0))
    _edit(spec, 2, flags=["PARTIAL"])
    code, out, err = compare(off, spec, "--baseline", "off")
    assert (code, err) == (0, ""), err
    row = speedup_rows(out)["spec"]
    assert row[0] == "2.00x (1.73-2.33, 2 runs)", row  # 20/10, min 19/11, max 21/9
    assert row[1] == "n/a" and row[2] == "n/a", row  # PARTIAL and VOID rungs carry no ratio
    assert "off" not in speedup_rows(out)  # the baseline is not its own arm
    # without --baseline there is no speed-up table
    assert "## Speed-up against" not in compare(off, spec)[1]


def test_an_unknown_baseline_is_one_line_and_non_zero(tmp_path, compare):
    off = write_run(tmp_path, "off", [ok(1, 100.0)])
    code, out, err = compare(off, "--baseline", "spec-off")
    assert code == 2 and err.count("\n") == 1 and "names no run" in err and "Traceback" not in err


def test_per_content_type_speedups_carry_the_spread_of_the_repeats(tmp_path, compare):
    """--dataset mix with --repeats: each repeat's TPOT per content type is kept (ladder.repeats.combine), so
    the per-type speed-up has an interval too, not only a pooled point."""
    def mixed(tpot: float, chat: float, code: float) -> object:
        return replace(ok(1, 100.0, tpot=tpot), by_content={"chat": ContentStats(2, summary(chat), None),
                                                             "code": ContentStats(2, summary(code), None)})
    off_rows = [mixed(20.0, 20.0, 19.0), mixed(22.0, 22.0, 21.0)]
    spec_rows = [mixed(10.0, 11.0, 5.0), mixed(12.0, 13.0, 7.0)]
    off_kept = repeats.combine(off_rows).repeats["by_content"]
    assert off_kept["chat"]["tpot_ms.mean"]["values"] == [20.0, 22.0]
    pooled = {"chat": ContentStats(4, summary(21.0), None), "code": ContentStats(4, summary(20.0), None)}
    off = write_run(tmp_path, "off", [replace(repeats.combine(off_rows), by_content=pooled)])
    pooled = {"chat": ContentStats(4, summary(12.0), None), "code": ContentStats(4, summary(6.0), None)}
    spec = write_run(tmp_path, "spec", [replace(repeats.combine(spec_rows), by_content=pooled)])
    code, out, err = compare(off, spec, "--baseline", "off")
    assert (code, err) == (0, ""), err
    # code: 20/6 = 3.33x, min 19/7 = 2.71x, max 21/5 = 4.20x
    assert "| spec | 1 | 12.0 ms, 1.75x (1.54-2.00, 2 runs) | 6.0 ms, 3.33x (2.71-4.20, 2 runs) |" in out, out
