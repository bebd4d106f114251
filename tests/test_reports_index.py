"""reports/README.md is what `make reports-index` writes now, and the generator refuses a report it cannot place.

It checks that the index is current, never that the reports are: a GPU report needs a GPU to rerun."""

import os
import subprocess
from pathlib import Path

import pytest

from benchmarks import reports_index
from benchmarks.reports_index import Declared, ReportsIndexError

ROOT = Path(__file__).resolve().parents[1]
# The named mutations run in copies of the tree without .git; the history is the original tree's (same HEAD).
REPO = Path(os.environ.get("MUTATIONS_ORIGIN", ROOT))


# The index counts commits from the ones the reports name: a shallow clone does not hold them.
_SHALLOW = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True, text=True)
needs_history = pytest.mark.skipif(_SHALLOW.stdout.strip() == "true", reason="a shallow clone: clone in full")


@needs_history
def test_the_committed_index_equals_a_fresh_generation():
    fresh = reports_index.generate(ROOT, REPO)
    committed = (ROOT / "reports/README.md").read_text()
    assert committed == fresh, "reports/README.md is not what the reports say now: run make reports-index"


def test_every_report_names_a_make_target_and_every_row_a_freshness_mark():
    index = (ROOT / "reports/README.md").read_text()
    rows = [line for line in index.splitlines() if line.startswith("| [")]
    assert len(rows) == len(reports_index.load_declarations()) > 0
    for line in rows:
        assert "`make " in line and ("**STALE**" in line or "| current |" in line), line


def test_a_report_whose_header_names_no_commit_is_refused(tmp_path):
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports/x.md").write_text("# X\n\nMade by `make x` on some day.\n")
    with pytest.raises(ReportsIndexError, match="names no commit"):
        reports_index.row(tmp_path, REPO, Declared("reports/x.md", "q?", "x", ("refengine/",), ()))


def test_a_commit_outside_the_history_is_refused(tmp_path):
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports/x.md").write_text("# X\n\nMade by `make x` at commit 0123abc, 2026-12-01.\n")
    with pytest.raises(ReportsIndexError, match="does not hold"):
        reports_index.row(tmp_path, REPO, Declared("reports/x.md", "q?", "x", ("refengine/",), ()))


def test_a_declaration_without_a_target_is_refused(tmp_path):
    toml = tmp_path / "r.toml"
    toml.write_text('[[report]]\npath = "reports/x.md"\nquestion = "q?"\nmeasures = ["refengine/"]\n')
    with pytest.raises(ReportsIndexError, match="declares no target"):
        reports_index.load_declarations(toml)


def test_a_file_no_report_declares_is_refused(tmp_path):
    (tmp_path / "reports/stray").mkdir(parents=True)
    (tmp_path / "reports/stray/old.md").write_text("# old\n")
    with pytest.raises(ReportsIndexError, match="no report"):
        reports_index.check_coverage(tmp_path, [Declared("reports/x.md", "q?", "x", ("refengine/",), ())])


@needs_history
def test_staleness_counts_only_the_code_a_report_measures():
    """A report's commits since are those touching its declared paths: the client's history is not the engine's."""
    demo = next(d for d in reports_index.load_declarations() if d.path == "reports/demo.md")
    engine_only = Declared(demo.path, demo.question, demo.target, ("refengine/",), ())
    nowhere = Declared(demo.path, demo.question, demo.target, ("no/such/path/",), ())
    commit = reports_index.row(ROOT, REPO, demo).commit
    engine_count = reports_index.git(REPO, "rev-list", "--count", f"{commit}..HEAD", "--", "refengine/")
    assert reports_index.row(ROOT, REPO, nowhere).commits_since == 0
    assert reports_index.row(ROOT, REPO, engine_only).commits_since == int(engine_count)


@pytest.mark.parametrize("head, device", [
    ("on AMD EPYC Processor x2 (1-minute load average 1.1)", "CPU, 2 cores"),
    ("on AMD EPYC x2 (1-minute load average 1.1)", "CPU, 2 cores"),
    ("on Intel(R) Xeon(R) Platinum 8480+ x16, torch 2.13.0+cpu", "CPU, 16 cores"),
    ("with one NVIDIA H200 and AMD EPYC x16", "NVIDIA H200"),
    ("eagle3 at 0.37x spec off's TPOT", "not stated"),
])
def test_the_device_is_read_from_the_header_whatever_the_cpu_is_called(head, device):
    assert reports_index.device_of(head) == device
