"""Reading per-test outcomes back from pytest's -rA short summary."""

from mutations.pytest_run import PytestRun, covers, focused_env, parse_summary

OUTPUT = """\
============================= FAILURES =============================
____ test_bad ____
FAILED tests/test_a.py::test_printed_by_a_test - this line is captured output, not a result
==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED tests/test_a.py::test_ok
PASSED tests/test_a.py::test_p[1]
PASSED tests/test_a.py::TestC::test_m
SKIPPED [1] tests/test_a.py:9: unconditional skip
ERROR tests/test_a.py::test_err - RuntimeError
FAILED tests/test_a.py::test_bad - assert 0
FAILED tests/test_a.py::test_p[a b - c] - AssertionError: assert 'a b - c' == 1
2 failed, 3 passed, 1 skipped, 1 error in 1.37s
"""


def test_only_lines_after_the_last_summary_header_count():
    passed, failed = parse_summary(OUTPUT)
    assert passed == (
        "tests/test_a.py::test_ok",
        "tests/test_a.py::test_p[1]",
        "tests/test_a.py::TestC::test_m",
    )
    assert failed == (
        "tests/test_a.py::test_err - RuntimeError",
        "tests/test_a.py::test_bad - assert 0",
        "tests/test_a.py::test_p[a b - c] - AssertionError: assert 'a b - c' == 1",
    )
    assert parse_summary("no summary here\nFAILED x.py::t - boom\n") == ((), ())


def test_requested_ids_cover_files_classes_and_parametrisations():
    line = "tests/test_a.py::test_p[a b - c] - AssertionError"
    assert covers("tests/test_a.py::test_p", line)
    assert covers("tests/test_a.py::test_p[a b - c]", line)
    assert covers("tests/test_a.py", line)
    assert covers("tests", line)
    assert covers("tests/test_a.py::TestC", "tests/test_a.py::TestC::test_m")
    assert not covers("tests/test_a.py::test_pp", line)
    assert not covers("tests/test_a.py::test", "tests/test_a.py::test_p[1]")
    assert not covers("tests/test_a", "tests/test_a.py::test_p[1]")


def test_run_attribution():
    passed, failed = parse_summary(OUTPUT)
    run = PytestRun(rc=1, timed_out=False, duration_s=1.0, passed=passed, failed=failed, output=OUTPUT)
    assert run.failures_of(("tests/test_a.py::test_bad", "tests/test_a.py::test_ok")) == [
        "tests/test_a.py::test_bad - assert 0"
    ]
    assert run.failures_of(("tests/test_a.py::test_printed_by_a_test",)) == []
    assert run.passes_of("tests/test_a.py::TestC")
    assert not run.passes_of("tests/test_a.py::test_bad")


def test_focused_env_pins_threads_and_bytecode(monkeypatch, tmp_path):
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    monkeypatch.setenv("PYTEST_ADDOPTS", "-x")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = focused_env(tmp_path)
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONPATH"].split(":") == [str(tmp_path), "/elsewhere"]
    assert "PYTEST_ADDOPTS" not in env
