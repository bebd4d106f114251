"""reports/ray-cluster.md: what a second Ray node buys the slow gates. The same two workloads run on a local
cluster of one node and then of two, each node given one CPU, on this machine: a sharded mutmut run of
part of refengine/sample/ (two shards, one mutmut child each) and a tiny-qwen3 oracle slice (every arm a
task). The wall time of each, the speed-up of two nodes over one, the nodes that ran tasks, and whether the
two clusters gave the same records. A benchmark, not a test: it writes numbers.

    python benchmarks/ray_speedup.py [--out reports/ray-cluster.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.ray_cluster import REPO, LocalCluster, local_cluster, mutmut_project
from ladder.host import describe, finish, provenance

# A part of sample/ whose mutants take a few minutes on one CPU: the counter-based RNG, the per-row
# sampler and its metadata, under the tests that import them.
MUTATE = ["refengine/sample/splitmix.py", "refengine/sample/rng.py", "refengine/sample/sampler.py",
          "refengine/sample/metadata.py"]
MUTATE_TESTS = ["tests/sample/test_rng.py", "tests/sample/test_sampler_rows.py", "tests/sample/test_metadata.py",
                "tests/sample/test_lossless_sampling.py"]
SHARDS = 2
ORACLE = ["--model", "tiny-qwen3", "--methods", "none,eagle", "--c", "1,4", "--prompts", "8", "--max-tokens", "16",
          "--no-structured", "--no-seeded", "--prefix-cache", "off"]
CPUS_PER_NODE = 1


class SpeedupError(RuntimeError):
    """A workload failed, or the two clusters disagreed: no speed-up is reported for it."""


@dataclass(frozen=True)
class Timed:
    wall_s: float
    nodes_used: int
    result: list[str]  # what must not depend on the cluster: the records, or the report's table rows


def _run(cmd: list[str], cwd: Path) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=3600)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SpeedupError(f"`{' '.join(cmd[:4])} ...` exited {proc.returncode}: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return wall, proc.stdout


def mutmut_shards(address: str, work: Path) -> tuple[float, list[str]]:
    root = mutmut_project(work / "project", MUTATE, MUTATE_TESTS)
    wall, _ = _run([str(Path(sys.executable).with_name("mutations")), "--root", str(root), "shard", "--executor", "ray",
                    "--address", address, "--count", str(SHARDS), "--max-children", "1"], root)
    records = sorted(
        f"{r['name']} {r['status']}" for p in sorted((root / ".mutations" / "shards").glob("*-of-*.jsonl"))
        for r in map(json.loads, p.read_text().splitlines())
    )
    if not records:
        raise SpeedupError("the mutmut shards wrote no records")
    return wall, records


def oracle_slice(address: str, work: Path) -> tuple[float, list[str]]:
    report = work / "oracle.md"
    wall, out = _run([sys.executable, "-m", "refengine.cli", "oracle", *ORACLE, "--executor", "ray", "--address",
                      address, "--write-report", "--report", str(report)], work)
    if "\n0 failed arm(s) " not in f"\n{out}":
        raise SpeedupError(f"the oracle slice failed arms: {out[-1500:]}")
    # The date, the elapsed time and the host line differ by design.
    return wall, [line for line in report.read_text().splitlines() if not line.startswith(("**Result:", "- c = "))]


def timed(cluster: LocalCluster, workload, work: Path) -> Timed:
    with cluster.nodes_that_ran_tasks() as seen:
        wall, result = workload(cluster.address, work)
    if not seen:
        raise SpeedupError(f"{workload.__name__}: no node was seen running its tasks")
    return Timed(wall, len(seen), result)


WORKLOADS = {
    f"mutmut, {SHARDS} shards of {len(MUTATE)} sample/ files": mutmut_shards,
    "oracle slice: tiny-qwen3, none and eagle, c = 1 and 4, with variants": oracle_slice,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "ray-cluster.md")
    args = parser.parse_args()
    header = provenance("ray-report")
    host = describe()
    runs: dict[str, dict[int, Timed]] = {name: {} for name in WORKLOADS}
    with tempfile.TemporaryDirectory(prefix="ray-speedup-") as tmp:
        for nodes in (1, 2):
            with local_cluster(nodes, CPUS_PER_NODE, Path(tmp) / f"logs-{nodes}") as cluster:
                for name, workload in WORKLOADS.items():
                    work = Path(tmp) / f"{nodes}-{workload.__name__}"
                    work.mkdir()
                    runs[name][nodes] = timed(cluster, workload, work)
                    print(f"{nodes} node(s): {name}: {runs[name][nodes].wall_s:.1f} s", flush=True)
    finish(host)
    for name, by_nodes in runs.items():
        if by_nodes[1].result != by_nodes[2].result:
            raise SpeedupError(f"{name}: two nodes gave other results than one")
    rows = [f"| {name} | {t[1].wall_s:.1f} | {t[2].wall_s:.1f} | {t[1].wall_s / t[2].wall_s:.2f}x | "
            f"{t[1].nodes_used} / {t[2].nodes_used} | identical ({len(t[1].result)} lines) |" for name, t in runs.items()]
    load = host["load_average"]
    args.out.write_text("\n".join([
        "# The Ray executor: the speed-up of a second node",
        "",
        header,
        "",
        f"Each node of the local cluster (`ray start --head`, then `ray start --address`) is given {CPUS_PER_NODE} "
        f"CPU, so one node runs one task at a time and two nodes run two. Both clusters run on this one machine "
        f"({host['cpu_count']} cores): the figure is what the executor gets from a second node's CPU, start-up, "
        "scheduling and result transfer included, not a cross-host network figure.",
        "",
        "| workload | 1 node, wall s | 2 nodes, wall s | speed-up | nodes that ran tasks (1 / 2) | results, 1 node against 2 |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"1-minute load average at the start {load['start']['1m']:.2f}, at the end {load['end']['1m']:.2f} "
        f"(overloaded: {host['overloaded']}).",
        f"The mutmut workload mutates {', '.join(f'`{m}`' for m in MUTATE)} under {', '.join(f'`{t}`' for t in MUTATE_TESTS)}; "
        f"the oracle slice is `refengine oracle {' '.join(ORACLE)} --executor ray`.",
        "",
    ]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    try:
        main()
    except SpeedupError as exc:
        sys.exit(f"ray-report: {exc}")
