"""`make` and `make help` list every target by group, from the `## GROUP | DESCRIPTION | DURATION` lines the
Makefile's header documents (scripts/make_help.py)."""

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_help", ROOT / "scripts/make_help.py")
make_help = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_help)


def test_every_phony_target_has_a_help_line():
    text = (ROOT / "Makefile").read_text()
    described = {e.target for e in make_help.parse(text)}
    missing = make_help.phony_targets(text) - described
    assert not missing, f"add a '## GROUP | DESCRIPTION | DURATION' line above the rule of: {sorted(missing)}"


def test_a_bare_make_prints_every_target_by_group():
    text = (ROOT / "Makefile").read_text()
    done = subprocess.run(["make", "--no-print-directory"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    printed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")}
    assert printed == {e.target for e in make_help.parse(text)}
    assert [t for t in make_help.GROUPS.values() if f"\n{t}:\n" in done.stdout] == list(make_help.GROUPS.values())


def test_a_help_line_must_name_a_group_and_sit_above_a_rule():
    with pytest.raises(make_help.HelpFormatError, match="not one of"):
        make_help.parse("## tests | runs the tests | 1 s\ntest:\n")
    with pytest.raises(make_help.HelpFormatError, match="directly above"):
        make_help.parse("## test | runs the tests | 1 s\n\ntest:\n")
    (entry,) = make_help.parse("## test | runs the tests | 1 s\ntest: install\n\tpytest\n")
    assert (entry.target, entry.group, entry.description, entry.duration) == ("test", "test", "runs the tests", "1 s")
