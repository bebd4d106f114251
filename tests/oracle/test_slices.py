"""`oracle merge` of slices built by hand: a c run in --methods parts beside full slices, and the slices it refuses."""

import dataclasses

import pytest

from refengine.oracle import command
from refengine.oracle.slices import Section, SliceMismatchError, SliceReport, render
from refengine.version import Build

ALL = "none, mtp, eagle, eagle3, dflash, ngram, draft_model, teacher, teacher-corrupt"
FIRST_HALF = "none, mtp, eagle, eagle3, dflash"
SECOND_HALF = "ngram, draft_model, teacher, teacher-corrupt"


def sections(c: int, tag: str) -> tuple[Section, ...]:
    # A table's body names its slice (tag), so that the test can find where each table landed.
    return tuple(
        Section(c, temp, title, f"### {title}\n\n| arm |\n|---|\n| {tag} |\n")
        for temp, title in ((0.0, f"c={c}, greedy"), (0.7, f"c={c}, temperature 0.7 (seeded)"))
    )


def slice_report(c: int, methods: str, tag: str, labels: dict[str, int]) -> SliceReport:
    return SliceReport(
        model="smollm2", methods=methods, k=3, num_prompts=8, max_tokens=32, temperature=0.7, seed=0, variants=True,
        concurrency=(c,), commit="abc", date="2026-12-02", host=f"host {tag}", sections=sections(c, tag),
        labels=labels, elapsed_s=100.0,
    )


def test_merge_combines_method_halves_of_one_c_with_a_full_slice():
    """Slices listed out of order (the second half first): the report still reads in matrix order."""
    second = slice_report(1, SECOND_HALF, "second", {"IDENTICAL": 40, "VACUOUS": 1})
    first = slice_report(1, FIRST_HALF, "first", {"IDENTICAL": 50})
    full = slice_report(8, ALL, "full", {"IDENTICAL": 90})
    text = render([second, full, first])
    assert f"- model: smollm2; methods: {ALL}; k = 3; c = 1, 8\n" in text
    assert "**Result: 1 failed arm(s) of 181 (180 IDENTICAL, 1 VACUOUS) in 300 s.**" in text
    order = [
        f"### c=1, greedy; methods: {FIRST_HALF}\n\n| arm |\n|---|\n| first |",
        f"### c=1, greedy; methods: {SECOND_HALF}\n\n| arm |\n|---|\n| second |",
        f"### c=1, temperature 0.7 (seeded); methods: {FIRST_HALF}\n\n| arm |\n|---|\n| first |",
        f"### c=1, temperature 0.7 (seeded); methods: {SECOND_HALF}\n\n| arm |\n|---|\n| second |",
        "### c=8, greedy\n\n| arm |\n|---|\n| full |",
        "### c=8, temperature 0.7 (seeded)\n\n| arm |\n|---|\n| full |",
    ]
    at = [text.index(table) for table in order]
    assert at == sorted(at) and text.count("### ") == len(order)
    logs = [line for line in text.splitlines() if line.startswith("- c = ")]
    assert logs == [
        "- c = 1 (methods none, mtp, eagle, eagle3, dflash): 0 failed arm(s) of 50 (50 IDENTICAL) in 100 s; "
        "2026-12-02, commit abc; host first",
        "- c = 1 (methods ngram, draft_model, teacher, teacher-corrupt): 1 failed arm(s) of 41 (40 IDENTICAL, "
        "1 VACUOUS) in 100 s; 2026-12-02, commit abc; host second",
        "- c = 8: 0 failed arm(s) of 90 (90 IDENTICAL) in 100 s; 2026-12-02, commit abc; host full",
    ]


def test_merge_refuses_two_slices_with_a_method_at_the_same_c():
    halves = [slice_report(1, FIRST_HALF, "a", {}), slice_report(1, "dflash, ngram, draft_model, teacher, teacher-corrupt", "b", {})]
    with pytest.raises(SliceMismatchError, match=r"^two slices ran the same c \(c = 1, methods dflash\)$"):
        render(halves)


def test_merge_refuses_a_c_lacking_methods_another_c_ran():
    slices = [slice_report(1, FIRST_HALF, "a", {}), slice_report(8, ALL, "full", {})]
    with pytest.raises(SliceMismatchError, match=r"^c = 1 lacks methods ngram, draft_model, teacher, teacher-corrupt$"):
        render(slices)


def test_merge_refuses_slices_differing_in_another_shared_field():
    second = dataclasses.replace(slice_report(1, SECOND_HALF, "b", {}), k=4)
    with pytest.raises(SliceMismatchError, match=r"^slices differ in k;"):
        render([slice_report(1, FIRST_HALF, "a", {}), second])


def test_merge_refuses_an_unknown_method():
    with pytest.raises(SliceMismatchError, match="unknown methods medusa"):
        render([slice_report(1, "none, medusa", "a", {})])


@pytest.mark.parametrize(
    "tree,stamp",
    [(Build("0.1", "abc123def456", False), "abc123def456"), (Build("0.1", "abc123def456", True), "abc123def456 (dirty)"),
     (Build("0.1", None, None), "no git commit")],
)  # fmt: skip
def test_a_slice_names_its_tree_dirty_when_it_is(monkeypatch, tree, stamp):
    """A slice run from a tree with uncommitted changes (a GPU host's copy ahead of its HEAD) says so."""
    monkeypatch.setattr(command, "build", lambda: tree)
    assert command._commit() == stamp
