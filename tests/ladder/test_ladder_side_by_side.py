"""Two ladders at once on one machine (two clones' `make demo`): each --serve-cmd server gets its own free
port and each run its own directory, so both finish and neither measures the other's server."""

import json
import os
import subprocess
import sys
from pathlib import Path

from ladder_harness import fake_cmd


def test_two_ladders_started_together_serve_on_their_own_ports(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    runs = [tmp_path / name for name in ("a", "b")]
    procs = [subprocess.Popen([sys.executable, "-c", "from ladder.cli import main; main()", "run", "--out", str(out),
                               "--serve-cmd", fake_cmd({"gap": 0.05}, port="{port}"), "--c", "1",
                               "--input-len", "64", "--output-len", "8", "--warmup", "0",
                               "--prompts-per-rung", "2"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for out in runs]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    urls = [json.loads((out / "manifest.json").read_text())["endpoint"]["base_url"] for out in runs]
    assert len(set(urls)) == 2, urls  # a server each; a fixed port would have failed the second to bind
