"""The mutmut score gate: strict-score arithmetic over export-cicd-stats, and one real mutmut run."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from mutations.cli import main
from mutations.gate import GateError, Threshold, evaluate, load_stats, load_threshold

DATA = Path(__file__).parent / "data" / "mutmut-cicd-stats.json"
REPO_THRESHOLD = Path(__file__).parents[2] / "mutations" / "threshold.toml"


def stats_file(tmp_path: Path, **changes: int) -> Path:
    data = json.loads(DATA.read_text()) | changes
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(data))
    return path


def threshold_file(tmp_path: Path, min_score: float, max_timeouts: int) -> Path:
    path = tmp_path / "threshold.toml"
    path.write_text(f"min_score = {min_score}\nmax_timeouts = {max_timeouts}\n")
    return path


def test_strict_score_arithmetic():
    stats = load_stats(DATA)
    # total 107 minus the labelled buckets (82+10+3+2+1+4+0+1 = 103) leaves 4 not checked.
    assert stats.not_checked == 4
    # skipped (2) is the only bucket left out of the denominator: 82+10+4+1+1+3+4.
    assert stats.scored == 105
    assert stats.score == pytest.approx(82 / 105)


def test_threshold_and_timeout_cap():
    stats = load_stats(DATA)
    assert evaluate(stats, Threshold(min_score=0.78, max_timeouts=4)).ok
    low = evaluate(stats, Threshold(min_score=0.79, max_timeouts=4))
    assert low.failures == ["score 0.7810 is below the threshold 0.7900"]
    capped = evaluate(stats, Threshold(min_score=0.5, max_timeouts=3))
    assert len(capped.failures) == 1 and "4 timeouts exceed the cap of 3" in capped.failures[0]


def test_interrupted_or_empty_runs_fail(tmp_path):
    lenient = Threshold(min_score=0.0, max_timeouts=100)
    interrupted = load_stats(stats_file(tmp_path, check_was_interrupted_by_user=1, total=108))
    assert "interrupted" in evaluate(interrupted, lenient).failures[0]
    empty = load_stats(
        stats_file(
            tmp_path,
            killed=0,
            survived=0,
            total=0,
            no_tests=0,
            skipped=0,
            suspicious=0,
            timeout=0,
            segfault=0,
        )
    )
    assert empty.score == 0.0
    assert evaluate(empty, lenient).failures == ["no mutant was killed or survived: nothing was tested"]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"killed": -1}, "killed must be a non-negative integer"),
        ({"timeout": True}, "timeout must be a non-negative integer"),
        ({"segfault": None}, "segfault must be a non-negative integer"),
        ({"total": 100}, "less than the sum"),
    ],
)
def test_malformed_stats(tmp_path, changes, message):
    with pytest.raises(GateError, match=message):
        load_stats(stats_file(tmp_path, **changes))


def test_threshold_file_validation(tmp_path):
    repo = load_threshold(REPO_THRESHOLD)
    # The cap is the one timeout read and listed in threshold.toml; the floor only ever rises.
    assert repo.max_timeouts == 1 and repo.min_score >= 0.96
    for text in ("min_score = 1.5\nmax_timeouts = 0\n", "min_score = 0.5\n", "nope"):
        (tmp_path / "t.toml").write_text(text)
        with pytest.raises(GateError):
            load_threshold(tmp_path / "t.toml")


def gate(tmp_path: Path, *args: str):
    return CliRunner().invoke(main, ["--root", str(tmp_path), "gate", *args])


def test_gate_cli(tmp_path):
    stats = str(stats_file(tmp_path))
    passing = gate(tmp_path, "--stats", stats, "--threshold-file", str(threshold_file(tmp_path, 0.78, 4)))
    assert passing.exit_code == 0, passing.output
    assert passing.output.splitlines()[-1] == "mutmut-gate: score 0.7810 (min 0.7800) PASS"
    failing = gate(tmp_path, "--stats", stats, "--threshold-file", str(threshold_file(tmp_path, 0.8, 4)))
    assert failing.exit_code == 1
    assert failing.output.splitlines()[-1] == "mutmut-gate: score 0.7810 (min 0.8000) FAIL"
    missing = gate(tmp_path, "--threshold-file", str(threshold_file(tmp_path, 0.8, 4)))
    assert missing.exit_code == 2
    assert "mutmut-cicd-stats.json" in missing.output


def test_gate_runs_mutmut_fresh_with_one_openmp_thread(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    root = tmp_path / "project"
    shutil.copytree(
        Path(__file__).parent / "mutmut_project", root, ignore=shutil.ignore_patterns("__pycache__")
    )
    # A stale result from an older run must not reach the gate: --run starts from an empty mutants/.
    (root / "mutants").mkdir()
    (root / "mutants" / "mutmut-cicd-stats.json").write_text(DATA.read_text())
    result = CliRunner().invoke(
        main,
        ["--root", str(root), "gate", "--run", "--threshold-file", str(threshold_file(tmp_path, 0.5, 0))],
    )
    assert result.exit_code == 0, result.output
    stats = load_stats(root / "mutants" / "mutmut-cicd-stats.json")
    assert stats.killed > 0 and stats.survived > 0  # `max(0, ...)` is never tested below zero
    assert stats.killed + stats.survived == stats.total
    assert result.output.splitlines()[-1].endswith("(min 0.5000) PASS")
    # The full run's raw records, for `mutations merge` (the per-file ratchet, the shards' durations).
    records = [json.loads(line) for line in (root / ".mutations" / "records.jsonl").read_text().splitlines()]
    assert len(records) == stats.total and sum(r["status"] == "killed" for r in records) == stats.killed


def test_a_scoped_gate_runs_and_scores_only_its_files(tmp_path):
    root = tmp_path / "project"
    shutil.copytree(
        Path(__file__).parent / "mutmut_project", root, ignore=shutil.ignore_patterns("__pycache__")
    )
    # A second module that no test reaches: mutmut scores its mutants "no tests", so any of them in the
    # scoped stats would fail the gate below.
    (root / "toy" / "untested.py").write_text("def double(x: int) -> int:\n    return x * 2 + 0\n")
    threshold = str(threshold_file(tmp_path, 0.5, 0))
    scoped = CliRunner().invoke(
        main, ["--root", str(root), "gate", "--run", "--scope", "toy/ledger.py", "--threshold-file", threshold]
    )
    assert scoped.exit_code == 0, scoped.output
    ledger = load_stats(root / "mutants" / "mutmut-cicd-stats.json")
    assert ledger.killed > 0 and ledger.no_tests == 0 and ledger.not_checked == 0
    assert ledger.killed + ledger.survived == ledger.total
    # The same mutants/ rescored over the other file: its mutants were never run, so they are unchecked.
    other = CliRunner().invoke(
        main, ["--root", str(root), "gate", "--scope", "toy/untested.py", "--threshold-file", threshold]
    )
    assert other.exit_code == 1, other.output
    untested = load_stats(root / "mutants" / "mutmut-cicd-stats.json")
    assert untested.total > 0 and untested.killed == 0
    assert set(json.loads((root / "mutants" / "mutmut-cicd-stats.json").read_text())) == set(
        json.loads(DATA.read_text())
    )
    nothing = CliRunner().invoke(
        main, ["--root", str(root), "gate", "--scope", "toy/absent.py", "--threshold-file", threshold]
    )
    assert nothing.exit_code == 2 and "no mutated source file matches" in nothing.output
    both = CliRunner().invoke(
        main, ["--root", str(root), "gate", "--scope", "toy/ledger.py", "--stats", str(DATA), "--threshold-file", threshold]
    )
    assert both.exit_code == 2 and "drop --stats" in both.output
