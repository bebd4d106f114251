"""A build names its tree dirty for changes to the code, not for the reports the make targets write into it."""

import subprocess

from refengine.version import OUTPUTS, is_dirty


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_reports_written_into_the_tree_leave_it_clean_and_code_changes_do_not(tmp_path):
    (tmp_path / OUTPUTS).mkdir()
    (tmp_path / OUTPUTS / "demo.md").write_text("old figures\n")
    (tmp_path / "engine.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "tree")
    assert is_dirty(tmp_path) is False
    (tmp_path / OUTPUTS / "demo.md").write_text("new figures\n")  # a make target rewrote its report
    (tmp_path / "scratch.txt").write_text("untracked\n")
    assert is_dirty(tmp_path) is False
    (tmp_path / "engine.py").write_text("x = 2\n")
    assert is_dirty(tmp_path) is True


def test_outside_a_checkout_it_is_unknown(tmp_path):
    assert is_dirty(tmp_path) is None
