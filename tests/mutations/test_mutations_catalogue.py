"""Catalogue parsing: the TOML format, its validation, inline unified patches, and applying mutants."""

import json
from pathlib import Path

import pytest
from mutations_helpers import FIXTURE, invoke

from mutations.catalogue import CatalogueError, load_catalogue, parse_unified_patch
from mutations.model import Edit, Status
from mutations.mutate import MutantRejected, mutate_source
from mutations.runner import check_apply

ENTRY = """
[[mutant]]
id = "M1"
title = "the bug"
invariant = "the invariant"
file = "pkg/mod.py"
old = "x = 1\\n"
new = "x = 2\\n"
tests = ["tests/test_mod.py::test_x", "tests/test_mod.py::test_y"]
must_fail = ["tests/test_mod.py::test_x"]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "catalogue.toml"
    path.write_text(text)
    return path


def test_entry_with_defaults(tmp_path):
    catalogue = load_catalogue(write(tmp_path, "[defaults]\ntimeout_s = 42\n" + ENTRY))
    (mutant,) = catalogue.mutants
    assert mutant.edits == (Edit("x = 1\n", "x = 2\n"),)
    assert mutant.timeout_s == 42.0
    assert mutant.must_fail == ("tests/test_mod.py::test_x",)
    assert catalogue.get("M1") is mutant
    assert catalogue.get("M2") is None


def test_fixture_catalogue_loads():
    ids = [m.id for m in load_catalogue(FIXTURE / "catalogue.toml").mutants]
    assert len(ids) == len(set(ids)) == 9


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda e: e.replace('id = "M1"\n', ""), "missing keys ['id']"),
        (lambda e: e + ENTRY, "duplicate mutant id"),
        (
            lambda e: e.replace('must_fail = ["tests/test_mod.py::test_x"]', 'must_fail = ["tests/x.py::t"]'),
            "not in tests",
        ),
        (lambda e: e.replace("must_fail = [", "must_fail = [] #"), "must be non-empty"),
        (lambda e: e.replace('old = "x = 1\\n"', 'old = ""'), "old must not be empty"),
        (lambda e: e + 'patch = "@@\\n-x\\n+y\\n"\n', "either old/new or patch"),
        (lambda e: e.replace('new = "x = 2\\n"\n', ""), "old and new must both be strings"),
        (lambda e: e.replace("pkg/mod.py", "pkg/mod.txt"), "must be a .py source"),
        (lambda e: e + "timeout_s = 0\n", "timeout_s must be positive"),
        (lambda e: e + "colour = 1\n", "unknown keys ['colour']"),
        (lambda e: e.replace('title = "the bug"', 'title = "  "'), "title must be a non-empty string"),
        (lambda e: e.replace("tests = [", "tests = [1, "), "tests must be a list of non-empty strings"),
        (lambda e: "mutants = 1\n" + e, "unknown top-level keys"),
        (lambda e: e + "[[[", "catalogue.toml"),
    ],
)
def test_malformed_entries_are_rejected(tmp_path, edit, message):
    with pytest.raises(CatalogueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_catalogue(write(tmp_path, edit(ENTRY)))


def test_patch_hunks_become_exact_edits():
    patch = (
        "diff --git a/m.py b/m.py\n"
        "--- a/m.py\n"
        "+++ b/m.py\n"
        "@@ -1,3 +1,3 @@\n"
        " def f():\n"
        "-    return 1\n"
        "+    return 2\n"
        "\n"  # a blank context line whose lone space an editor stripped
        "@@ -10,2 +10,2 @@ def g():\n"
        "-    y = 3\n"
        "\\ No newline at end of file\n"
        "+    y = 4\n"
        "\\ No newline at end of file\n"
    )
    assert parse_unified_patch(patch, "P") == (
        Edit("def f():\n    return 1\n\n", "def f():\n    return 2\n\n"),
        Edit("    y = 3", "    y = 4"),
    )


@pytest.mark.parametrize(
    "patch, message",
    [
        ("--- a/m.py\n+++ b/m.py\n", "no hunks"),
        ("@@ -1 +1 @@\n+only an addition\n", "cannot be located"),
        ("@@ -1 +1 @@\n?what\n", "not understood"),
    ],
)
def test_bad_patches(patch, message):
    with pytest.raises(CatalogueError, match=message):
        parse_unified_patch(patch, "P")


def _mutant(tmp_path, old, new="x = 2\n"):
    # json.dumps writes a TOML basic string: same quoting and escapes for these values.
    entry = ENTRY.replace('old = "x = 1\\n"', f"old = {json.dumps(old)}")
    entry = entry.replace('new = "x = 2\\n"', f"new = {json.dumps(new)}")
    return load_catalogue(write(tmp_path, entry)).mutants[0]


def test_mutate_source_applies_once(tmp_path):
    assert mutate_source(_mutant(tmp_path, "x = 1\n"), b"x = 1\ny = 1\n") == b"x = 2\ny = 1\n"


@pytest.mark.parametrize(
    "source, old, new, status, message",
    [
        (b"y = 1\n", "x = 1\n", "x = 2\n", Status.DOES_NOT_APPLY, "occurs 0 times"),
        (b"x = 1\nx = 1\n", "x = 1\n", "x = 2\n", Status.DOES_NOT_APPLY, "occurs 2 times"),
        (b"x = 1\n", "x = 1\n", "x = (\n", Status.INVALID_MUTANT, "does not compile"),
        (b"x = 1\n", "x", "x", Status.INVALID_MUTANT, "unchanged"),
        (b"\xff\xfe", "x", "y", Status.DOES_NOT_APPLY, "not UTF-8"),
    ],
)
def test_mutate_source_rejections(tmp_path, source, old, new, status, message):
    with pytest.raises(MutantRejected, match=message) as info:
        mutate_source(_mutant(tmp_path, old, new), source)
    assert info.value.status is status


def test_check_apply_on_the_fixture(project):
    checks = {
        c.id: c.status for c in check_apply(load_catalogue(project / "catalogue.toml").mutants, project)
    }
    assert checks["DOES_NOT_APPLY"] is Status.DOES_NOT_APPLY
    assert checks["INVALID_MUTANT"] is Status.INVALID_MUTANT
    assert {i for i, s in checks.items() if s is not None} == {"DOES_NOT_APPLY", "INVALID_MUTANT"}


def test_check_apply_flags_missing_targets_and_test_files(project):
    (project / "tests" / "test_red.py").unlink()
    catalogue = load_catalogue(project / "catalogue.toml")
    checks = {c.id: c for c in check_apply(catalogue.mutants, project)}
    assert checks["PRE_RED"].status is Status.PRE_RED
    (project / "toyledger.py").unlink()
    assert {c.status for c in check_apply(catalogue.mutants, project)} == {Status.DOES_NOT_APPLY}


def test_check_apply_cli_writes_nothing(project):
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    result = invoke(project, "check-apply")
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == "check-apply: 7 ok, 2 failed"
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before
    assert invoke(project, "check-apply", "--only", "KILLED", "--only", "SURVIVED").exit_code == 0


def test_list_and_show(project):
    listed = invoke(project, "list")
    assert listed.exit_code == 0
    assert "KILLED_BY_WRONG_TEST" in listed.output
    shown = invoke(project, "show", "KILLED_PATCH")
    assert shown.exit_code == 0
    assert (
        "-    remaining = placeholders - rejected\n+    remaining = placeholders + rejected\n" in shown.output
    )
    assert "--- a/toyledger.py" in shown.output
    drifted = invoke(project, "show", "DOES_NOT_APPLY")
    assert drifted.exit_code == 1
    assert "DOES_NOT_APPLY" in drifted.output


def test_malformed_catalogue_is_exit_2(project):
    (project / "bad.toml").write_text("[[mutant]]\nid = 'X'\n")
    result = invoke(project, "list", catalogue=project / "bad.toml")
    assert result.exit_code == 2
    assert "missing keys" in result.output
