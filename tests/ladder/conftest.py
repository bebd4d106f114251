import json
import subprocess
import sys

import pytest
from ladder_harness import FAKE


@pytest.fixture
def fake_server():
    """Start the scripted fake server in its own process; returns its base URL."""
    procs = []

    def start(**script) -> str:
        proc = subprocess.Popen([sys.executable, str(FAKE), "--script", json.dumps(script)],
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        port = int(proc.stdout.readline().split()[1])
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture
def ladder(capsys, tmp_path):
    """Run `ladder` in-process; returns (exit code, stdout, stderr, out dir)."""
    from ladder.cli import main

    def run(*args: str):
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        with pytest.raises(SystemExit) as exc:
            main(["run", "--out", str(out), *args])
        cap = capsys.readouterr()
        return exc.value.code, cap.out, cap.err, out

    return run

