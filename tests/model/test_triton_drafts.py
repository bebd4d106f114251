"""The drafters' fixed-shape proposals under the Triton attention kernels, in Triton's CPU interpreter
(beside test_triton_attention.py, which runs the kernels alone the same way)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_triton_kernels_under_the_interpreter_draft_what_the_reference_drafts():
    """triton_draft_cases.py in a fresh process: TRITON_INTERPRET must be set before triton is imported."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    cases = Path(__file__).with_name("triton_draft_cases.py")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(cases)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
