"""The PR-scoped gate (`mutations gate --diff BASE`) on real commits in a tiny git project, through real mutmut."""

import re
import shutil
import subprocess
from pathlib import Path

from click.testing import CliRunner

from mutations.cli import main
from mutations.diffgate import judge, sample
from mutations.diffscope import changed_functions, default_base, load_scope
from mutations.plan import PlannedMutant
from mutations.records import MutantRecord
from mutations.survivors import RecordedSurvivor

PROJECT = Path(__file__).parent / "mutmut_project"


def git(root: Path, *args: str) -> str:
    env_args = ["-c", "user.email=ci@example.invalid", "-c", "user.name=ci"]
    return subprocess.run(["git", *env_args, *args], cwd=root, check=True, capture_output=True, text=True).stdout


def commit(root: Path, message: str) -> None:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)


def git_project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(PROJECT, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / ".gitignore").write_text(".mutations/\nmutants/\n__pycache__/\n")
    git(root, "init", "-q", "-b", "main")
    commit(root, "base")
    return root


def diff_gate(root: Path, base: str = "HEAD~1"):
    return CliRunner().invoke(main, ["--root", str(root), "gate", "--diff", base])


UNTESTED_BRANCH = '''def release(placeholders: int, rejected: int) -> int:
    """Placeholders still outstanding after a verify step rejected `rejected` drafts."""
    if rejected > placeholders:
        raise ValueError("more drafts rejected than proposed")
    remaining = placeholders - rejected
    return max(0, remaining)
'''

FLOOR = "def floor0(n: int) -> int:\n    if n <= 0:\n        return 0\n    return n\n"
FLOOR_TEST = (
    "from toy.floor import floor0\n\n\ndef test_floor0():\n"
    "    assert (floor0(-3), floor0(1), floor0(5)) == (0, 1, 5)\n"
)


def test_red_on_a_commit_that_adds_an_untested_branch(tmp_path):
    root = git_project(tmp_path)
    (root / "toy" / "ledger.py").write_text(UNTESTED_BRANCH)
    commit(root, "refuse over-rejection, untested")
    result = diff_gate(root)
    assert result.exit_code == 1, result.output
    assert "FAILED: survived: toy.ledger.x_release__mutmut_" in result.output
    assert "rejected > placeholders" in result.output  # the mutation is shown to the reviewer
    assert result.output.splitlines()[-1].endswith("FAIL")


def test_green_on_a_commit_that_changes_only_docs(tmp_path):
    root = git_project(tmp_path)
    (root / "README.md").write_text("# toy\n\nA ledger.\n")
    (root / "toy" / "ledger.py").write_text((root / "toy" / "ledger.py").read_text() + "# a comment after the function\n\n")
    commit(root, "docs")
    result = diff_gate(root)
    assert result.exit_code == 0, result.output
    assert "0 changed functions in scope, 0 mutants" in result.output
    assert result.output.splitlines()[-1] == "diff-gate: PASS (no mutant in the change: nothing in mutmut's scope changed)"


def test_green_on_a_commit_with_a_recorded_equivalent_mutant(tmp_path):
    root = git_project(tmp_path)
    (root / "toy" / "floor.py").write_text(FLOOR)
    (root / "tests" / "test_floor.py").write_text(FLOOR_TEST)
    commit(root, "floor0")
    red = diff_gate(root)
    assert red.exit_code == 1, red.output
    # `n <= 0` -> `n < 0` returns 0 for n = 0 either way: equivalent. The gate prints what to record.
    (line,) = [line for line in red.output.splitlines() if line.startswith("FAILED:")]
    name, digest = re.match(r"FAILED: survived: (\S+) \[(\w+)\] \(if n <= 0: -> if n < 0:\)", line).groups()
    (root / "mutations").mkdir()
    (root / "mutations" / "survivors.toml").write_text(
        f'[survivor."{name}"]\nreason = "equivalent"\ndigest = "{digest}"\nnote = "floor0(0) is 0 both ways"\n'
    )
    commit(root, "record the equivalent mutant")
    green = diff_gate(root, "HEAD~2")
    assert green.exit_code == 0, green.output
    assert f"excused: survived, recorded equivalent: {name}" in green.output
    assert green.output.splitlines()[-1] == "diff-gate: 2 of 3 killed, 1 recorded survivors PASS"


def planned(name: str, digest: str = "d1") -> PlannedMutant:
    return PlannedMutant(name, "toy/floor.py", "x_f", digest, "a -> b")


def test_a_survivor_passes_only_with_its_own_digest_and_a_killed_entry_is_stale():
    chosen = [planned("m.x_f__mutmut_1"), planned("m.x_f__mutmut_2")]
    records = [MutantRecord("m.x_f__mutmut_1", "toy/floor.py", "survived", 0.1, "t"), MutantRecord("m.x_f__mutmut_2", "toy/floor.py", "killed", 0.1, "t")]
    entry = RecordedSurvivor("m.x_f__mutmut_1", "equivalent", "d1", "same output")
    assert judge(chosen, records, {entry.name: entry}) == ([], ["survived, recorded equivalent: m.x_f__mutmut_1 [d1] (a -> b): same output"])
    moved = RecordedSurvivor("m.x_f__mutmut_1", "equivalent", "old", "same output")
    failures, _ = judge(chosen, records, {moved.name: moved})
    assert failures == ["survived: m.x_f__mutmut_1 [d1] (a -> b): recorded for digest old, another mutation"]
    stale = RecordedSurvivor("m.x_f__mutmut_2", "gpu-only", "d1", "cuda")
    failures, _ = judge(chosen, records, {entry.name: entry, stale.name: stale})
    assert failures == ["stale survivor entry: m.x_f__mutmut_2 is now killed; delete it from the file"]
    failures, _ = judge(chosen, [MutantRecord("m.x_f__mutmut_1", "toy/floor.py", "no tests", 0.0, "t"), records[1]], {})
    assert failures == ["no tests: m.x_f__mutmut_1 [d1] (a -> b)"]


def test_changed_functions_map_hunks_onto_function_and_method_spans(tmp_path):
    root = git_project(tmp_path)
    (root / "toy" / "shapes.py").write_text(
        "def area(w, h):\n    return w * h\n\n\nclass Box:\n    def volume(self, d):\n        d = d * 2\n        return d\n\n"
        "    def name(self):\n        return 'box'\n"
    )
    commit(root, "shapes")
    scope = load_scope(root / "pyproject.toml")
    text = (root / "toy" / "shapes.py").read_text()
    (root / "toy" / "shapes.py").write_text(text.replace("        d = d * 2\n", "").replace("'box'", "'crate'"))
    (root / "tests" / "test_toy_ledger.py").write_text((root / "tests" / "test_toy_ledger.py").read_text() + "\n")
    # A pure deletion (volume's first line) touches the line it left behind; tests/ is outside source_paths.
    names = [(f.path, f.mangled) for f in changed_functions(root, "HEAD", scope)]
    assert names == [("toy/shapes.py", "xǁBoxǁname"), ("toy/shapes.py", "xǁBoxǁvolume")]


def test_the_base_is_the_merge_base_with_origins_default_branch_else_head_1(tmp_path):
    root = git_project(tmp_path)
    (root / "toy" / "floor.py").write_text(FLOOR)
    commit(root, "second")
    assert default_base(root) == "HEAD~1"  # a fresh clone of main with no other branch
    fork = git(root, "rev-parse", "HEAD").strip()
    git(root, "update-ref", "refs/remotes/origin/main", fork)
    git(root, "symbolic-ref", "refs/remotes/origin/HEAD", "refs/remotes/origin/main")
    git(root, "checkout", "-q", "-b", "topic")
    for n in (1, 2):
        (root / "toy" / "floor.py").write_text(FLOOR + f"# {n}\n")
        commit(root, f"topic {n}")
    assert default_base(root) == fork  # the whole branch, not only its last commit


def test_the_sample_is_deterministic_and_capped():
    mutants = [planned(f"m.x_f__mutmut_{i}") for i in range(1, 41)]
    first = sample(mutants, 10)
    assert len(first) == 10 and first == sample(list(reversed(mutants)), 10)
    assert sample(mutants, 0) == mutants and sample(mutants, 40) == mutants
