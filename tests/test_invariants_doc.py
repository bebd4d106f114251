"""docs/invariants.md is the one place the engine's numbered invariants are written down: every number
the code cites has an entry, every file that cites one names the doc, and every entry names a test and
a catalogue mutant that exist."""

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "invariants.md"
CITATION = re.compile(r"\b[Ii]nvariants? (\d+(?:(?:, | and )\d+)*)")
ENTRY = re.compile(r"^## (\d+)\. (.+)$", re.MULTILINE)
TEST_ID = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
MUTANT_LINE = re.compile(r"^- Mutant: (.+)$", re.MULTILINE)
# References to a text that is not in the repository.
FOREIGN = re.compile(r"design note|\u00a7\s*\d|Section [A-F]\.\d")


def doc_entries() -> dict[int, str]:
    text = DOC.read_text()
    marks = list(ENTRY.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return {int(m.group(1)): text[m.start() : end] for m, end in zip(marks, ends, strict=True)}


def python_files() -> list[Path]:
    return sorted(p for top in ("refengine", "tests", "ladder", "mutations") for p in (ROOT / top).rglob("*.py"))


def cited_numbers(text: str) -> set[int]:
    return {int(n) for m in CITATION.finditer(text) for n in re.split(r", | and ", m.group(1))}


def test_every_cited_invariant_has_an_entry_and_the_citing_file_names_the_doc():
    entries = doc_entries()
    missing, unnamed = [], []
    for path in python_files():
        text = path.read_text()
        numbers = cited_numbers(text)
        missing += [f"{path.relative_to(ROOT)}: invariant {n}" for n in sorted(numbers - entries.keys())]
        if numbers and "docs/invariants.md" not in text:
            unnamed.append(str(path.relative_to(ROOT)))
    assert not missing, f"cited but not in docs/invariants.md: {missing}"
    assert not unnamed, f"cite invariant numbers without naming docs/invariants.md: {unnamed}"


def test_no_citation_of_a_text_outside_the_repository():
    hits = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in python_files()
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if FOREIGN.search(line) and path != Path(__file__).resolve()
    ]
    assert not hits, hits


@pytest.mark.parametrize("number, entry", sorted(doc_entries().items()))
def test_each_entry_names_existing_code_tests_and_mutants(number, entry):
    catalogue = tomllib.loads((ROOT / "mutations" / "catalogue.toml").read_text())
    must_fail = {m["id"]: {t.split("[")[0] for t in m["must_fail"]} for m in catalogue["mutant"]}
    mutant_ids = set(must_fail)
    tests = TEST_ID.findall(entry)
    assert tests, f"invariant {number} names no test"
    for file, name in tests:
        source = ROOT / file
        assert source.is_file(), f"invariant {number}: {file} does not exist"
        assert re.search(rf"^(async )?def {name}\(", source.read_text(), re.MULTILINE), f"{file}::{name}"
    (mutants,) = MUTANT_LINE.findall(entry)
    named = [m.strip() for m in mutants.split(",")]
    assert set(named) <= mutant_ids, f"invariant {number}: unknown mutants {set(named) - mutant_ids}"
    # Each mutant is killed by a test this entry names: the entry, its test and its mutant agree.
    named_tests = {f"{file}::{name}" for file, name in tests}
    for mutant in named:
        assert must_fail[mutant] & named_tests, f"invariant {number}: {mutant} is killed by none of {named_tests}"
    for path in re.findall(r"`(refengine/[\w/]+\.py)`", entry):
        assert (ROOT / path).is_file(), f"invariant {number}: {path} does not exist"
