"""Under a mutant, each test's pytest-timeout bound scales with its own time in mutmut's stats run
(mutations/mutant_bound.py): a test far slower than it measured is failed at its bound, one within its bound
passes, and outside a mutant's run nothing is bounded."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SLEEP_S = 2.5


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmutant_bound_floor_s = 1\nmutant_bound_factor = 10\n")
    (tmp_path / "test_slow.py").write_text(f"import time\n\ndef test_slow():\n    time.sleep({SLEEP_S})\n")
    return tmp_path


def run(project: Path, measured_s: float, mutant: str | None) -> subprocess.CompletedProcess:
    (project / "mutmut-stats.json").write_text(json.dumps({"duration_by_test": {"test_slow.py::test_slow": measured_s}}))
    env = {k: v for k, v in os.environ.items() if k != "MUTANT_UNDER_TEST"}
    if mutant is not None:
        env["MUTANT_UNDER_TEST"] = mutant
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "mutations.mutant_bound"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=120)


def test_a_test_far_slower_than_its_stats_time_fails_at_its_bound_under_a_mutant(project):
    bounded = run(project, measured_s=0.01, mutant="refengine.sample.rng.x_seed__mutmut_3")
    assert bounded.returncode == 1 and "Timeout (>1.0s)" in bounded.stdout, bounded.stdout[-2000:]


def test_a_test_within_its_bound_passes_and_nothing_is_bounded_outside_a_mutant(project):
    within = run(project, measured_s=SLEEP_S / 5, mutant="refengine.sample.rng.x_seed__mutmut_3")
    assert within.returncode == 0, within.stdout[-2000:]
    for outside in (None, "stats"):
        unbounded = run(project, measured_s=0.01, mutant=outside)
        assert unbounded.returncode == 0, unbounded.stdout[-2000:]
