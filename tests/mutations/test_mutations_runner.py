"""The runner classifies each fixture mutant correctly and always leaves the target as it found it."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mutations_helpers import CLI, copy_fixture, invoke, statuses

from mutations.catalogue import load_catalogue
from mutations.cli import EXIT_RESTORE_FAILED
from mutations.files import sha256_hex
from mutations.journal import Journal, recover
from mutations.model import Status
from mutations.preloaded import PreloadedPytest, PreloadError
from mutations.report import NO_COMMIT, tree_commit
from mutations.runner import JournalPending, Runner

TARGET = "toyledger.py"
EXPECTED = [
    "KILLED",
    "KILLED_PATCH",
    "SURVIVED",
    "DOES_NOT_APPLY",
    "INVALID_MUTANT",
    "PRE_RED",
    "TIMEOUT",
    "KILLED_BY_WRONG_TEST",
    "ERROR",
]


HANG_CATALOGUE = """
[[mutant]]
id = "HANG"
title = "taking the next request never returns"
invariant = "scheduling a request terminates"
file = "toyledger.py"
old = "    return queue.pop(0)\\n"
new = "    while True:\\n        pass\\n"
tests = ["tests/test_ledger.py::test_queue_is_fifo"]
must_fail = ["tests/test_ledger.py::test_queue_is_fifo"]
timeout_s = 120
"""


KILLED_ENTRY = """
[[mutant]]
id = "KILLED"
title = "the placeholder count is not decremented by the rejected drafts"
invariant = "placeholders == proposed - rejected"
file = "toyledger.py"
old = "    remaining = placeholders - rejected\\n"
new = "    remaining = placeholders\\n"
tests = ["tests/test_ledger.py::test_release_subtracts_rejections"]
must_fail = ["tests/test_ledger.py::test_release_subtracts_rejections"]
"""


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """One CLI run over the whole fixture catalogue; the tests below read its outcome."""
    root = copy_fixture(tmp_path_factory.mktemp("full") / "project")
    target = root / TARGET
    # An old mtime, so a restore that forgot the mtime cannot pass by landing in the same second.
    os.utime(target, ns=(1_500_000_000_000_000_000, 1_500_000_000_123_456_789))
    before = target.stat()
    result = invoke(root, "run", "--write-report")
    return root, before, result


def test_each_fixture_mutant_gets_its_status(full_run):
    root, _, _ = full_run
    got = statuses(root / ".mutations" / "report.json")
    assert list(got) == EXPECTED
    for mutant_id, status in got.items():
        assert status == mutant_id.removesuffix("_PATCH"), mutant_id


def test_run_exit_code_and_closing_line(full_run):
    _, _, result = full_run
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == "named-mutations: 2 passed, 7 failed"


def test_target_is_restored_byte_for_byte_with_its_mtime(full_run):
    root, before, _ = full_run
    target = root / TARGET
    assert target.read_bytes() == (Path(__file__).parent / "fixture_pkg" / TARGET).read_bytes()
    assert target.stat().st_mtime_ns == before.st_mtime_ns
    assert not (root / "__pycache__").exists()
    assert not (root / ".mutations" / "journal.json").exists()


def test_report_records_attribution_and_hashes(full_run):
    root, _, _ = full_run
    mutants = {m["id"]: m for m in json.loads((root / ".mutations" / "report.json").read_text())["mutants"]}
    original_sha = sha256_hex((root / TARGET).read_bytes())
    killed = mutants["KILLED"]
    assert killed["failed_tests"] == ["tests/test_ledger.py::test_release_subtracts_rejections"]
    assert killed["sha256_before"] == killed["sha256_after"] == original_sha
    assert killed["output_tail"] == ""
    assert mutants["KILLED_BY_WRONG_TEST"]["failed_tests"] == ["tests/test_ledger.py::test_queue_is_fifo"]
    assert "test_red_on_the_clean_tree" in mutants["PRE_RED"]["output_tail"]
    assert mutants["ERROR"]["pytest_rc"] in (2, 3, 4, 5)
    assert mutants["TIMEOUT"]["pytest_rc"] is None


def test_markdown_report_lists_every_mutant(full_run):
    root, _, _ = full_run
    markdown = (root / "reports" / "mutations.md").read_text()
    assert "`named-mutations: 2 passed, 7 failed`" in markdown
    assert "(commit none: not a git checkout)" in markdown  # the fixture copy is no checkout: it says so
    for mutant_id in EXPECTED:
        assert f"| {mutant_id} |" in markdown
    assert "- **SURVIVED** SURVIVED:" in markdown


def test_budget_exhaustion_makes_the_rest_incomplete(project):
    # HANG's own limit (120 s) is far above the budget, so the budget stops it: INCOMPLETE, not TIMEOUT.
    (project / "budget.toml").write_text(HANG_CATALOGUE + KILLED_ENTRY)
    result = invoke(project, "run", "--budget-seconds", "2", catalogue=project / "budget.toml")
    assert result.exit_code == 1
    assert statuses(project / ".mutations" / "report.json") == {"HANG": "INCOMPLETE", "KILLED": "INCOMPLETE"}
    assert (project / TARGET).read_bytes() == (Path(__file__).parent / "fixture_pkg" / TARGET).read_bytes()
    assert result.output.splitlines()[-1] == "named-mutations: 0 passed, 2 failed"


def _corrupting_writer(path: Path, data: bytes) -> None:
    path.write_bytes(data + b"# restore went wrong\n")


def test_failed_restore_aborts_the_run_and_keeps_the_journal(project):
    target = project / TARGET
    original, mtime_ns = target.read_bytes(), target.stat().st_mtime_ns
    catalogue = load_catalogue(project / "catalogue.toml")
    selected = tuple(m for m in catalogue.mutants if m.id in ("KILLED", "SURVIVED"))
    runner = Runner(project, project / ".mutations", restore_writer=_corrupting_writer)
    first, second = runner.run(selected)
    assert first.status is Status.RESTORE_FAILED
    assert first.sha256_after != first.sha256_before
    assert second.status is Status.INCOMPLETE
    journal = Journal(project / ".mutations")
    assert journal.exists()
    # A new run refuses to start on top of an unrecovered mutation.
    with pytest.raises(JournalPending):
        Runner(project, project / ".mutations").run(selected)
    assert "restored" in recover(journal)
    assert target.read_bytes() == original
    assert target.stat().st_mtime_ns == mtime_ns
    assert not journal.exists()


def test_cli_exits_3_on_restore_failure(project, monkeypatch):
    import mutations.cli as cli

    def faulty_runner(*args, **kwargs):
        return Runner(*args, restore_writer=_corrupting_writer, **kwargs)

    monkeypatch.setattr(cli, "Runner", faulty_runner)
    result = invoke(project, "run", "--only", "KILLED")
    assert result.exit_code == EXIT_RESTORE_FAILED
    assert result.output.splitlines()[-1] == "named-mutations: 0 passed, 1 failed"
    restored = invoke(project, "restore")
    assert restored.exit_code == 0, restored.output
    assert (project / TARGET).read_bytes() == (Path(__file__).parent / "fixture_pkg" / TARGET).read_bytes()


def _start_hanging_run(project: Path) -> tuple[subprocess.Popen, Journal]:
    """Start the CLI on a mutant that hangs, and return once the mutated tests are running."""
    (project / "hang.toml").write_text(HANG_CATALOGUE)
    proc = subprocess.Popen(
        [*CLI, "--root", str(project), "--catalogue", str(project / "hang.toml"), "run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    journal = Journal(project / ".mutations")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if journal.exists() and journal.load().test_pgid is not None:
            return proc, journal
        if proc.poll() is not None:
            pytest.fail(f"runner ended early: {proc.stdout.read().decode()}")
        time.sleep(0.02)
    proc.kill()
    pytest.fail("the runner never reached the mutated test run")


def _group_gone(pgid: int) -> bool:
    """True once no live process is left in the group (zombies awaiting their reaper count as gone)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        live = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                live.append(stat)
        if not live:
            return True
        time.sleep(0.05)
    return False


def test_sigkilled_runner_is_recovered_from_the_journal(project):
    target = project / TARGET
    original, mtime_ns = target.read_bytes(), target.stat().st_mtime_ns
    proc, journal = _start_hanging_run(project)
    pgid = journal.load().test_pgid
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert target.read_bytes() != original, "killed mid-mutation: the mutant must still be on disk"

    result = invoke(project, "restore")
    assert result.exit_code == 0, result.output
    assert target.read_bytes() == original
    assert target.stat().st_mtime_ns == mtime_ns
    assert not journal.exists()
    # The orphaned test run, still spinning in the mutant, was stopped too.
    assert _group_gone(pgid)
    assert invoke(project, "restore").output.strip() == "no journal: nothing to restore"


def test_sigterm_restores_before_the_runner_exits(project):
    target = project / TARGET
    original, mtime_ns = target.read_bytes(), target.stat().st_mtime_ns
    proc, journal = _start_hanging_run(project)
    pgid = journal.load().test_pgid
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    proc.stdout.close()
    assert target.read_bytes() == original
    assert target.stat().st_mtime_ns == mtime_ns
    assert not journal.exists()
    assert _group_gone(pgid)


def test_restore_refuses_while_the_runner_lives(project):
    proc, journal = _start_hanging_run(project)
    try:
        result = invoke(project, "restore")
        assert result.exit_code == 1
        assert "still alive" in result.output
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        proc.stdout.close()
    assert not journal.exists()


def test_run_refuses_to_start_over_a_pending_journal(project):
    proc, _ = _start_hanging_run(project)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    result = invoke(project, "run", "--only", "KILLED")
    assert result.exit_code == 2
    assert "mutations restore" in result.output
    assert invoke(project, "restore").exit_code == 0


def test_empty_selection_is_red(project):
    (project / "empty.toml").write_text("[defaults]\ntimeout_s = 5\n")
    result = invoke(project, "run", catalogue=project / "empty.toml")
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == "named-mutations: 0 passed, 0 failed"


def test_unknown_only_id_is_a_usage_error(project):
    result = invoke(project, "run", "--only", "NOPE")
    assert result.exit_code == 2
    assert "NOPE" in result.output


def test_write_report_needs_the_whole_catalogue(project):
    result = invoke(project, "run", "--only", "KILLED", "--write-report")
    assert result.exit_code == 2


def test_regenerated_report_keeps_the_mutmut_section():
    from mutations.report import KEEP_MARKER, keep_marked_section

    old = f"# Named mutations\n\nold table\n\n{KEEP_MARKER}\n## mutmut\n\nscore 0.86\n"
    new = keep_marked_section("# Named mutations\n\nnew table\n", old)
    assert "new table" in new and "old table" not in new
    assert new.endswith(f"{KEEP_MARKER}\n## mutmut\n\nscore 0.86\n")
    assert keep_marked_section("# t\n", "# no marker\n") == "# t\n"


def test_parallel_run_gives_each_mutant_the_same_status_and_never_touches_the_tree(full_run, tmp_path):
    """--jobs 2: the same verdicts as the one-tree run, in catalogue order, from copies of the tree."""
    root = copy_fixture(tmp_path / "project")
    before = {p: p.read_bytes() for p in root.rglob("*.py")}
    result = invoke(root, "run", "--jobs", "2")
    assert statuses(root / ".mutations" / "report.json") == statuses(full_run[0] / ".mutations" / "report.json")
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == "named-mutations: 2 passed, 7 failed"
    assert {p: p.read_bytes() for p in root.rglob("*.py")} == before
    assert not (root / ".mutations" / "journal.json").exists()


def test_the_report_names_the_commit_of_the_tree_and_whether_it_was_dirty(tmp_path):
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "f.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert tree_commit(tmp_path) == head
    (tmp_path / "f.py").write_text("x = 2\n")
    assert tree_commit(tmp_path) == f"{head}-dirty"
    assert tree_commit(tmp_path / "f.py") == NO_COMMIT


def test_runs_forked_from_a_preloaded_server_give_every_status_the_plain_runs_give(full_run, tmp_path):
    """[defaults] preload: each focused run is forked from one server; the verdicts (the mutant's code imported
    fresh, TIMEOUT's process group killed, ERROR, PRE_RED) are those of one interpreter a run."""
    root = copy_fixture(tmp_path / "project")
    catalogue = root / "catalogue.toml"
    catalogue.write_text(catalogue.read_text().replace("[defaults]\n", '[defaults]\npreload = ["json"]\n', 1))
    before = {p: p.read_bytes() for p in root.rglob("*.py")}
    invoke(root, "run")
    assert statuses(root / ".mutations" / "report.json") == statuses(full_run[0] / ".mutations" / "report.json")
    assert {p: p.read_bytes() for p in root.rglob("*.py")} == before


def test_a_preload_of_the_trees_own_module_is_refused(project):
    with pytest.raises(PreloadError, match=r"modules of the tree: \['toyledger'\]"):
        PreloadedPytest(project, dict(os.environ), ("json", "toyledger"))
