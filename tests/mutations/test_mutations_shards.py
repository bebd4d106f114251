"""Shards of the full mutmut run, their merge of raw records, and the per-file ratchet, through real mutmut."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from mutations.cli import main
from mutations.gate import GateError
from mutations.plan import PlannedMutant
from mutations.ratchet import FileScore, check
from mutations.records import MutantRecord, merge
from mutations.shards import coverage_failures, parse_shard, partition

PROJECT = Path(__file__).parent / "mutmut_project"
# A second module with two tested functions, so that shards and files differ.
SHAPES = "def area(w: int, h: int) -> int:\n    return w * h\n\n\ndef perimeter(w: int, h: int) -> int:\n    return 2 * (w + h)\n"
SHAPES_TEST = (
    "from toy.shapes import area, perimeter\n\n\ndef test_area():\n    assert area(2, 3) == 6\n\n\n"
    "def test_perimeter():\n    assert perimeter(2, 3) == 10\n"
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(PROJECT, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "toy" / "shapes.py").write_text(SHAPES)
    (root / "tests" / "test_shapes.py").write_text(SHAPES_TEST)
    (root / "threshold.toml").write_text("min_score = 0.5\nmax_timeouts = 0\n")
    return root


def cli(root: Path, *args: str):
    return CliRunner().invoke(main, ["--root", str(root), *args])


def merge_cli(root: Path, *parts: str, write: bool = False):
    return cli(root, "merge", *parts, "--threshold-file", str(root / "threshold.toml"), *(["--write-scores"] if write else []))


def records(path: Path) -> dict[str, str]:
    return {r["name"]: r["status"] for r in map(json.loads, path.read_text().splitlines())}


def test_shards_merge_to_the_single_run_and_the_ratchet_bites_when_a_test_goes(root):
    whole = cli(root, "shard", "--shard", "1/1")
    assert whole.exit_code == 0, whole.output
    single = root / ".mutations" / "shards" / "1-of-1.jsonl"
    first = merge_cli(root, str(single), write=True)
    assert first.exit_code == 0, first.output
    scores = (root / "mutations" / "scores.toml").read_text()
    assert '[file."toy/shapes.py"]' in scores and '[file."toy/ledger.py"]' in scores
    assert set(json.loads((root / "mutations" / "durations.json").read_text())) == set(records(single))
    # Two shards, balanced by the durations just written: disjoint, together the same records.
    parts = []
    for i in (1, 2):
        done = cli(root, "shard", "--shard", f"{i}/2")
        assert done.exit_code == 0, done.output
        parts.append(root / ".mutations" / "shards" / f"{i}-of-2.jsonl")
    halves = [records(p) for p in parts]
    assert halves[0] and halves[1] and not set(halves[0]) & set(halves[1])
    assert halves[0] | halves[1] == records(single)
    merged = merge_cli(root, *map(str, parts))
    assert merged.exit_code == 0, merged.output
    assert merged.output.splitlines()[-1] == first.output.splitlines()[-2]  # the same verdict line
    # One shard alone drops mutants: refused, not scored as a smaller run.
    alone = merge_cli(root, str(parts[0]))
    assert alone.exit_code == 1 and "have no record (a shard dropped them)" in alone.output
    # Remove the test that kills perimeter's mutants: the shards of the old tree no longer score this checkout,
    # and the fresh run's shapes.py falls below its recorded score.
    (root / "tests" / "test_shapes.py").write_text(SHAPES_TEST.split("\n\n\ndef test_perimeter")[0] + "\n")
    stale = merge_cli(root, *map(str, parts))
    assert stale.exit_code == 2 and "the records are of tree" in stale.output, stale.output
    assert cli(root, "shard", "--shard", "1/1").exit_code == 0
    red = merge_cli(root, str(single))
    assert red.exit_code == 1, red.output
    assert "FAILED: toy/shapes.py: score 0.2500 fell below its recorded 1.0000" in red.output
    assert "toy/ledger.py" not in "".join(line for line in red.output.splitlines() if line.startswith("FAILED"))


def test_the_partition_is_balanced_deterministic_and_complete():
    names = [f"m{i}" for i in range(10)]
    durations = {"m0": 9.0, "m1": 5.0, "m2": 4.0}
    shards = partition(names, durations, 3)
    assert sorted(n for s in shards for n in s) == sorted(names)
    assert shards == partition(list(reversed(names)), durations, 3)
    # The unknown seven weigh the median of the known (5 s): 9 | 5+5+5... spread by load.
    loads = [sum(durations.get(n, 5.0) for n in s) for s in shards]
    assert max(loads) - min(loads) <= 5.0
    assert partition(names, {}, 1) == [sorted(names)]


def test_merge_refuses_overlap_and_the_ratchet_compares_the_right_way():
    a = MutantRecord("m.x_f__mutmut_1", "f.py", "killed", 0.1, "tree-a")
    with pytest.raises(GateError, match="in two shards"):
        merge([[a], [a]])
    # Two shards of one partition, each run on its own checkout: verdicts on different code.
    with pytest.raises(GateError, match=r"from 2 trees \(tree-a, tree-b\)"):
        merge([[a], [MutantRecord("m.x_f__mutmut_2", "f.py", "killed", 0.1, "tree-b")]])
    plan = [PlannedMutant("m.x_f__mutmut_1", "f.py", "x_f", "d", "c"), PlannedMutant("m.x_f__mutmut_2", "f.py", "x_f", "d", "c")]
    assert "1 planned mutants have no record" in coverage_failures(plan, [a])[0]
    scores = {"f.py": FileScore("f.py", 9, 10), "g.py": FileScore("g.py", 5, 10)}
    assert check(scores, {"f.py": 0.9}, 0.96) == ["g.py: new file scores 0.5000, below the threshold 0.9600"]
    assert check(scores, {"f.py": 0.95, "g.py": 0.4}, 0.96) == ["f.py: score 0.9000 fell below its recorded 0.9500"]
    with pytest.raises(GateError, match="1..n"):
        parse_shard("3/2")
    assert parse_shard("2/4") == (2, 4)
