"""The Ray executor on a real two-node Ray cluster on this machine (`ray start --head`, then a second
`ray start --address`): mutmut shards of refengine/sample/ and a tiny-qwen3 oracle slice as Ray tasks
give the records and the report the local run gives."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from mutations.cli import main

REPO = Path(__file__).parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
# Two small files of sample/ (a few functions) under the one test file that imports them.
PYPROJECT = """[tool.mutmut]
source_paths = ["refengine/"]
only_mutate = ["refengine/sample/splitmix.py", "refengine/sample/rng.py"]
pytest_add_cli_args_test_selection = ["tests/sample/test_rng.py"]
pytest_add_cli_args = ["-p", "no:cacheprovider"]

[tool.pytest.ini_options]
addopts = "-p no:hypothesispytest -p no:anyio"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], temp_dir: Path) -> subprocess.Popen:
    # --block keeps `ray start` in the foreground: the node's processes are its children, in a session of
    # their own, and end with it.
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [RAY, "start", "--block", "--num-cpus", "2", "--disable-usage-stats", *args],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=(temp_dir / f"{len(list(temp_dir.iterdir()))}.log").open("w"),
    )


def _alive_nodes(address: str) -> int:
    probe = subprocess.run(
        [sys.executable, "-c", f"import ray; ray.init(address='{address}', log_to_driver=False); "
         "print(sum(n['Alive'] for n in ray.nodes()))"], capture_output=True, text=True, timeout=120,
    )
    return int(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 else 0


def _stop(node: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(node.pid, sig)
        except ProcessLookupError:
            return
        try:
            node.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("ray-logs")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    nodes = [_start(["--head", "--port", str(port), "--include-dashboard", "false",
                     "--ray-client-server-port", str(_free_port())], logs)]
    try:
        deadline = time.monotonic() + 240
        while _alive_nodes(address) < 1 and time.monotonic() < deadline:
            time.sleep(2)
        nodes.append(_start(["--address", address], logs))
        while _alive_nodes(address) < 2 and time.monotonic() < deadline:
            time.sleep(2)
        assert _alive_nodes(address) == 2, "the two-node Ray cluster did not come up: " + "".join(
            p.read_text()[-2000:] for p in logs.iterdir())
        yield address
    finally:
        for node in reversed(nodes):
            _stop(node)
        # Ray's worker processes run in sessions of their own: those of this cluster (its GCS port on their
        # command line) are ended by pid, once their nodes are gone.
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if any(arg.endswith(f":{port}") and arg.startswith("--gcs-address") for arg in proc.info["cmdline"] or ()):
                with contextlib.suppress(psutil.Error):
                    proc.kill()


@pytest.fixture
def sample_project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(REPO / "refengine", root / "refengine", ignore=shutil.ignore_patterns("__pycache__", "heads"))
    (root / "tests" / "sample").mkdir(parents=True)
    shutil.copy2(REPO / "tests" / "conftest.py", root / "tests" / "conftest.py")
    shutil.copy2(REPO / "tests" / "sample" / "test_rng.py", root / "tests" / "sample" / "test_rng.py")
    (root / "pyproject.toml").write_text(PYPROJECT)
    return root


def statuses(*parts: Path) -> dict[str, str]:
    return {r["name"]: r["status"] for p in parts for r in map(json.loads, p.read_text().splitlines())}


@pytest.mark.timeout(900)
def test_mutmut_shards_on_two_ray_nodes_merge_to_the_local_run(cluster, sample_project):
    root = sample_project
    local = CliRunner().invoke(main, ["--root", str(root), "shard", "--shard", "1/1"])
    assert local.exit_code == 0, local.output
    shards = root / ".mutations" / "shards"
    on_ray = CliRunner().invoke(
        main, ["--root", str(root), "shard", "--executor", "ray", "--address", cluster, "--count", "2"]
    )
    assert on_ray.exit_code == 0, on_ray.output
    nodes = {line.rsplit("(node ", 1)[1] for line in on_ray.output.splitlines() if "(node " in line}
    assert len(nodes) == 2, on_ray.output  # one shard per node: each task takes both of a node's CPUs
    single, ray_parts = statuses(shards / "1-of-1.jsonl"), statuses(shards / "1-of-2.jsonl", shards / "2-of-2.jsonl")
    assert len(single) > 10 and "killed" in single.values()
    assert ray_parts == single
    threshold = root / "threshold.toml"
    threshold.write_text("min_score = 0.0\nmax_timeouts = 0\n")
    verdicts = [
        CliRunner().invoke(main, ["--root", str(root), "merge", *map(str, parts), "--threshold-file", str(threshold)])
        for parts in ([shards / "1-of-1.jsonl"], [shards / "1-of-2.jsonl", shards / "2-of-2.jsonl"])
    ]
    assert [v.output.splitlines()[-1] for v in verdicts][0] == verdicts[1].output.splitlines()[-1]


def _oracle(cwd: Path, *args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "refengine.cli", "oracle", "--model", "tiny-qwen3", "--methods", "none,eagle",
         "--c", "1,4", "--prompts", "4", "--max-tokens", "8", "--no-variants", "--no-structured", "--no-seeded",
         "--prefix-cache", "off", "--write-report", "--report", "oracle.md", *args],
        cwd=cwd, capture_output=True, text=True, timeout=800, env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 failed arm(s)" in proc.stdout
    # The date, the elapsed time and the host line differ by design.
    return [line for line in (cwd / "oracle.md").read_text().splitlines() if not line.startswith(("**Result:", "- c = "))]


@pytest.mark.timeout(900)
def test_an_oracle_slice_on_two_ray_nodes_reports_what_the_local_run_reports(cluster, tmp_path):
    (tmp_path / "local").mkdir()
    (tmp_path / "ray").mkdir()
    local = _oracle(tmp_path / "local")
    on_ray = _oracle(tmp_path / "ray", "--executor", "ray", "--address", cluster)
    assert any("| sync/eagle |" in line or "eagle" in line for line in local)
    assert on_ray == local
