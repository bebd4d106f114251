"""A real local Ray cluster of N nodes on this machine (`ray start --head`, then `ray start --address` for each
other node), and a small mutmut project of refengine's own files: what the Ray executor's CI test and
reports/ray-cluster.md both run on."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from ladder.server import free_port

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
UP_WITHIN_S = 240
# Ray worker titles that are not a running task.
NOT_TASKS = frozenset({"ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent"})


class ClusterError(RuntimeError):
    """The local cluster did not come up with all its nodes."""


def _start(args: list[str], cpus: int, log: Path) -> subprocess.Popen:
    # --block keeps `ray start` in the foreground: the node's processes are its children, in a session of
    # their own, and end with it.
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [RAY, "start", "--block", "--num-cpus", str(cpus), "--disable-usage-stats", *args],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )


def alive_nodes(address: str) -> int:
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


@dataclass(frozen=True)
class LocalCluster:
    address: str
    nodes: list[subprocess.Popen]  # each `ray start --block`, its raylet and workers among its descendants

    def busy_nodes(self) -> set[int]:
        """The nodes (by index) one of whose processes is running a task now: Ray titles a worker
        `ray::<task function>` while it runs one, and `ray::IDLE` or an agent's name otherwise."""
        busy = set()
        for index, node in enumerate(self.nodes):
            with contextlib.suppress(psutil.Error):
                for proc in psutil.Process(node.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        title = " ".join(proc.cmdline())
                        if title.startswith("ray::") and title.split()[0] not in NOT_TASKS:
                            busy.add(index)
        return busy

    @contextlib.contextmanager
    def nodes_that_ran_tasks(self, every_s: float = 0.5) -> Iterator[set[int]]:
        """The set fills, while the block runs, with the nodes seen running a task."""
        seen: set[int] = set()
        done = threading.Event()

        def watch() -> None:
            while not done.wait(every_s):
                seen.update(self.busy_nodes())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            yield seen
        finally:
            done.set()
            watcher.join()


@contextlib.contextmanager
def local_cluster(nodes: int, cpus_per_node: int, logs: Path) -> Iterator[LocalCluster]:
    """The cluster while it runs; every node and Ray worker process is gone afterwards."""
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    address = f"127.0.0.1:{port}"
    started = [_start(["--head", "--port", str(port), "--include-dashboard", "false",
                       "--ray-client-server-port", str(free_port())], cpus_per_node, logs / "node-1.log")]
    try:
        deadline = time.monotonic() + UP_WITHIN_S
        for n in range(1, nodes + 1):
            if n > 1:
                started.append(_start(["--address", address], cpus_per_node, logs / f"node-{n}.log"))
            while alive_nodes(address) < n and time.monotonic() < deadline:
                time.sleep(2)
        if alive_nodes(address) != nodes:
            raise ClusterError(f"the {nodes}-node Ray cluster did not come up: " + "".join(
                p.read_text()[-2000:] for p in sorted(logs.iterdir())))
        yield LocalCluster(address, started)
    finally:
        for node in reversed(started):
            _stop(node)
        # Ray's worker processes run in sessions of their own: those of this cluster (its GCS port on their
        # command line) are ended by pid, once their nodes are gone.
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if any(arg.endswith(f":{port}") and arg.startswith("--gcs-address") for arg in proc.info["cmdline"] or ()):
                with contextlib.suppress(psutil.Error):
                    proc.kill()


def mutmut_project(dest: Path, only_mutate: list[str], test_files: list[str]) -> Path:
    """A copy of refengine/ (without the shipped heads) and the named test files, with a [tool.mutmut] that
    mutates only `only_mutate` under those tests."""
    shutil.copytree(REPO / "refengine", dest / "refengine", ignore=shutil.ignore_patterns("__pycache__", "heads"))
    for test in ["tests/conftest.py", *test_files]:
        (dest / test).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / test, dest / test)
    (dest / "pyproject.toml").write_text(
        f'[tool.mutmut]\nsource_paths = ["refengine/"]\nonly_mutate = {json.dumps(only_mutate)}\n'
        f'pytest_add_cli_args_test_selection = {json.dumps(test_files)}\npytest_add_cli_args = ["-p", "no:cacheprovider"]\n\n'
        '[tool.pytest.ini_options]\naddopts = "-p no:hypothesispytest -p no:anyio"\n'
    )
    return dest
