"""`mutations run --clean-run JUNIT`: a mutant whose focused tests all passed in a JUnit report of the same
tree skips its clean-tree run; any other mutant still gets one, with the verdict it had without the report."""

import subprocess
import sys
from pathlib import Path

import pytest
from mutations_helpers import copy_fixture, invoke, statuses

import mutations.runner as runner_module
from mutations.catalogue import load_catalogue
from mutations.clean_run import load_clean_run
from mutations.model import Status
from mutations.pytest_run import focused_env
from mutations.runner import Runner

SHAPES = '''
import pytest

@pytest.mark.parametrize("x", ["a.b", "c::d", "e - f", "g[h]"])
def test_p(x):
    pass

class TestOuter:
    def test_m(self):
        pass

    class TestInner:
        @pytest.mark.parametrize("n", [1, 2])
        def test_n(self, n):
            assert n == 1

def test_skip():
    pytest.skip("skipped on purpose")

@pytest.mark.xfail
def test_xfail():
    assert 0

@pytest.fixture
def breaks_on_teardown():
    yield
    raise RuntimeError("teardown")

def test_teardown_error(breaks_on_teardown):
    pass
'''

# Skips one ledger test in the run that writes the report, not in the tree the mutants run in.
SKIP_RELEASE = '''
import pytest

def pytest_collection_modifyitems(items):
    for item in items:
        if item.name == "test_release_subtracts_rejections":
            item.add_marker(pytest.mark.skip(reason="skipped in the reported run"))
'''


def _junit(project: Path, out: Path, *args: str) -> Path:
    """A real pytest run of `project` (or of `args` in it) with its JUnit report written to `out`."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={out}", *args]
    subprocess.run(cmd, cwd=project, env=focused_env(project), capture_output=True, check=False)
    if not out.is_file():
        pytest.fail(f"pytest wrote no JUnit report for {args}")
    return out


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    (root / "pytest.ini").write_text("[pytest]\ntestpaths = tests\naddopts = -p no:hypothesispytest -p no:anyio\n")
    (root / "tests" / "sub.dir").mkdir(parents=True)
    (root / "tests" / "test_shapes.py").write_text(SHAPES)
    (root / "tests" / "sub.dir" / "test_deep.py").write_text("def test_deep():\n    pass\n")
    (root / "tests" / "test_broken.py").write_text("import module_that_does_not_exist\n")
    report = _junit(root, root / "junit.xml", "--continue-on-collection-errors")
    return root, load_clean_run(report, root)


def test_junit_testcases_become_pytest_node_ids(shapes):
    _, clean = shapes
    shapes_py = "tests/test_shapes.py"
    assert sorted(clean.outcomes) == sorted(
        [
            "tests/sub.dir/test_deep.py::test_deep",
            "tests/test_broken.py",  # a collection error: the file itself is the testcase
            f"{shapes_py}::test_p[a.b]",
            f"{shapes_py}::test_p[c::d]",
            f"{shapes_py}::test_p[e - f]",
            f"{shapes_py}::test_p[g[h]]",
            f"{shapes_py}::TestOuter::test_m",
            f"{shapes_py}::TestOuter::TestInner::test_n[1]",
            f"{shapes_py}::TestOuter::TestInner::test_n[2]",
            f"{shapes_py}::test_skip",
            f"{shapes_py}::test_xfail",
            f"{shapes_py}::test_teardown_error",
        ]
    )


def test_a_requested_id_passes_only_if_everything_under_it_passed(shapes):
    _, clean = shapes
    shapes_py = "tests/test_shapes.py"
    for requested in (
        f"{shapes_py}::test_p",
        f"{shapes_py}::test_p[c::d]",
        f"{shapes_py}::TestOuter::test_m",
        f"{shapes_py}::TestOuter::TestInner::test_n[1]",
        "tests/sub.dir",
        "tests/sub.dir/test_deep.py",
    ):
        assert clean.passed(requested), requested
    for requested in (
        f"{shapes_py}::TestOuter",  # test_n[2] under it failed
        f"{shapes_py}::TestOuter::TestInner::test_n",
        f"{shapes_py}::test_skip",
        f"{shapes_py}::test_xfail",
        f"{shapes_py}::test_teardown_error",
        shapes_py,
        "tests/test_broken.py",
        "tests/test_broken.py::test_anything",  # nothing ran under it
        f"{shapes_py}::test_not_in_the_report",
        "tests",
    ):
        assert not clean.passed(requested), requested


@pytest.fixture(scope="module")
def fixture_reports(tmp_path_factory):
    """JUnit reports of the fixture project: the whole suite (test_red fails), one with a ledger test skipped,
    one without it. Any copy of the fixture is the same tree, so each report holds for every copy."""
    scratch = tmp_path_factory.mktemp("reports")
    root = copy_fixture(scratch / "project")
    full = _junit(root, scratch / "full.xml")
    missing = _junit(root, scratch / "missing.xml", "tests/test_red.py", "tests/test_ledger.py::test_queue_is_fifo")
    (root / "conftest.py").write_text(SKIP_RELEASE)
    skipped = _junit(root, scratch / "skipped.xml")
    return {"full": full, "missing": missing, "skipped": skipped}


def _run_counting(project: Path, mutant_id: str, report: Path | None, monkeypatch) -> tuple[Status, bool, int]:
    """Run one fixture mutant through the runner; count the pytest subprocesses it starts."""
    calls = []
    real = runner_module.run_pytest

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(runner_module, "run_pytest", counting)
    mutant = load_catalogue(project / "catalogue.toml").get(mutant_id)
    clean = None if report is None else load_clean_run(report, project)
    (result,) = Runner(project, project / ".mutations", clean_run=clean).run((mutant,))
    return result.status, result.clean_run_skipped, len(calls)


def test_a_mutant_covered_by_the_report_runs_one_pytest_not_two(project, fixture_reports, monkeypatch):
    assert _run_counting(project, "KILLED", None, monkeypatch) == (Status.KILLED, False, 2)
    assert _run_counting(project, "KILLED", fixture_reports["full"], monkeypatch) == (Status.KILLED, True, 1)


@pytest.mark.parametrize("report", ["missing", "skipped"])
def test_a_test_missing_or_skipped_in_the_report_still_gets_its_clean_tree_run(
    project, fixture_reports, monkeypatch, report
):
    assert _run_counting(project, "KILLED", fixture_reports[report], monkeypatch) == (Status.KILLED, False, 2)


def test_a_test_failed_in_the_report_still_gets_its_clean_tree_run_and_is_pre_red(
    project, fixture_reports, monkeypatch
):
    # PRE_RED's tests include test_red, red in the report: the clean-tree run is made and finds it red.
    assert _run_counting(project, "PRE_RED", fixture_reports["full"], monkeypatch) == (Status.PRE_RED, False, 1)


def test_parallel_run_with_a_clean_run_report_counts_the_skips(project, fixture_reports):
    selected = ("KILLED", "SURVIVED", "PRE_RED", "KILLED_BY_WRONG_TEST")
    args = [arg for mutant_id in selected for arg in ("--only", mutant_id)]
    result = invoke(project, "run", "--jobs", "2", *args, "--clean-run", str(fixture_reports["full"]))
    assert statuses(project / ".mutations" / "report.json") == {m: m for m in selected}
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (
        "named-mutations: 1 passed, 3 failed; 3 of 4 clean-tree runs skipped (passed in the clean-run report)"
    )


@pytest.mark.parametrize(
    "content",
    [
        None,
        "not xml at all",
        "<html><body/></html>",
        '<testsuites><testsuite><testcase name="test_x"/></testsuite></testsuites>',
        '<testsuite><testcase classname="tests.test_elsewhere" name="test_x"/></testsuite>',
    ],
    ids=["missing", "not-xml", "not-junit", "no-classname", "another-tree"],
)
def test_a_bad_report_is_refused_in_one_line(project, content):
    report = project / "junit.xml"
    if content is not None:
        report.write_text(content)
    result = invoke(project, "run", "--jobs", "2", "--only", "KILLED", "--clean-run", str(report))
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: clean-run report")


def test_an_address_that_fits_two_files_vouches_for_neither(tmp_path):
    # tests/x.py::TestC::test_m and tests/x/TestC.py::test_m are both written as tests.x.TestC / test_m.
    (tmp_path / "tests" / "x").mkdir(parents=True)
    (tmp_path / "tests" / "x.py").write_text("")
    (tmp_path / "tests" / "x" / "TestC.py").write_text("")
    report = tmp_path / "junit.xml"
    report.write_text('<testsuites><testsuite><testcase classname="tests.x.TestC" name="test_m"/></testsuite></testsuites>')
    clean = load_clean_run(report, tmp_path)
    assert clean.outcomes == {"tests/x.py::TestC::test_m": False, "tests/x/TestC.py::test_m": False}
