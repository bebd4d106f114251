"""mutmut shards as Ray tasks on a cluster (`mutations shard --executor ray --address ADDR --count N`).

Each shard is one task of `max_children` CPUs, run by `run_mutants` in its own scratch directory under
the checkout, which every node must hold at the same path (a shared filesystem, or the same clone on
each host): the task ships mutant names, not the tree. Run it from the checkout: Ray puts the driver's
working directory first on its workers' sys.path. Ray is an optional extra (`pip install
.[ray]`); the default executor stays mutmut's own process children on this machine. Tasks return raw
records and the node that ran them; the caller writes one record file per shard for `mutations merge`.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from mutations.plan import PlannedMutant
from mutations.records import MutantRecord
from mutations.scratch import run_mutants


def _run_shard(root: str, scratch: str, chosen: list[dict], tests: list[str], max_children: int, timeout_s: float | None):
    import ray

    records, failure = run_mutants(
        Path(root), Path(scratch), [PlannedMutant(**m) for m in chosen], tests, max_children, timeout_s
    )
    return [asdict(r) for r in records], failure, ray.get_runtime_context().get_node_id()


def run_on_ray(
    address: str,
    root: Path,
    shards: list[list[PlannedMutant]],
    scratches: list[Path],
    tests: list[str],
    max_children: int,
    timeout_s: float | None,
) -> list[tuple[list[MutantRecord], str | None, str]]:
    """(records, failure, node id) per shard, in shard order."""
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("--executor ray needs Ray: pip install '.[ray]'") from exc
    # Workers import this package from where it lies here, which every node must hold at the same path.
    package_root = str(Path(__file__).resolve().parents[1])
    env = {"PYTHONPATH": package_root, "OMP_NUM_THREADS": "1"}
    ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=max_children)(_run_shard)
        refs = [
            task.remote(str(root), str(scratch), [asdict(m) for m in chosen], tests, max_children, timeout_s)
            for chosen, scratch in zip(shards, scratches, strict=True)
        ]
        done = ray.get(refs)
    finally:
        ray.shutdown()
    return [([MutantRecord(**r) for r in records], failure, node) for records, failure, node in done]
