"""The Ray executor on a real two-node Ray cluster on this machine (`ray start --head`, then a second
`ray start --address`): mutmut shards of refengine/sample/ and a tiny-qwen3 oracle slice as Ray tasks
give the records and the report the local run gives."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from benchmarks.ray_cluster import REPO, local_cluster, mutmut_project
from mutations.cli import main


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with local_cluster(nodes=2, cpus_per_node=2, logs=tmp_path_factory.mktemp("ray-logs")) as cluster:
        yield cluster.address


@pytest.fixture
def sample_project(tmp_path: Path) -> Path:
    # Two small files of sample/ (a few functions) under the one test file that imports them.
    return mutmut_project(tmp_path / "project", ["refengine/sample/splitmix.py", "refengine/sample/rng.py"],
                          ["tests/sample/test_rng.py"])


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
