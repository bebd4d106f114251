"""Runs batches of oracle arms, in this process or in a pool of worker processes. Arms are independent
engine runs, so only where they run changes; results come back in the order the arms were given."""

import logging
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from refengine.model.loader import LoadedModel, load_model
from refengine.oracle.arms import Arm
from refengine.oracle.run import ArmResult, TensorParallel, Workload, run_arm

Job = tuple[Arm, Workload]
OnDone = Callable[[Workload, ArmResult], None]


def resolve_model(name: str, device: str = "cpu") -> LoadedModel:
    loaded = load_model(name)
    # The engines follow the weights; drafters are moved to the same device when each one is built.
    loaded.model.to(device)
    return loaded


@dataclass(frozen=True)
class _ArmSettings:
    """What every runner gives each arm's engine, wherever the arm runs."""

    block_size: int
    tensor_parallel: TensorParallel | None


@dataclass(frozen=True)
class InProcessRunner(_ArmSettings):
    model: LoadedModel

    def run(self, jobs: Sequence[Job], on_done: OnDone) -> list[ArmResult]:
        results = []
        for arm, workload in jobs:
            results.append(run_arm(self.model, arm, workload, self.block_size, tensor_parallel=self.tensor_parallel))
            on_done(workload, results[-1])
        return results


@dataclass(frozen=True)
class PoolRunner(_ArmSettings):
    pool: ProcessPoolExecutor

    def run(self, jobs: Sequence[Job], on_done: OnDone) -> list[ArmResult]:
        futures: dict[Future[ArmResult], Workload] = {
            self.pool.submit(_run_in_worker, arm, workload, self.block_size, self.tensor_parallel): workload
            for arm, workload in jobs
        }
        for future in as_completed(futures):
            on_done(futures[future], future.result())
        return [future.result() for future in futures]


@dataclass(frozen=True)
class RayRunner(_ArmSettings):
    """Each arm a Ray task on the cluster `ray.init` joined (one GPU each on a CUDA device); a Ray worker
    process loads the model once, on its first arm, and keeps it for the next."""

    model_name: str
    device: str

    def run(self, jobs: Sequence[Job], on_done: OnDone) -> list[ArmResult]:
        import ray

        task = ray.remote(num_cpus=1, num_gpus=0 if self.device == "cpu" else 1)(_run_in_ray_worker)
        refs = {
            task.remote(self.model_name, self.device, arm, workload, self.block_size, self.tensor_parallel): workload
            for arm, workload in jobs
        }
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            on_done(refs[ready[0]], ray.get(ready[0]))
        return ray.get(list(refs))


Runner = InProcessRunner | PoolRunner | RayRunner


# The engine builder's logger (refengine.engine.engine_args logs as "refengine"): it warns at every build
# about a drafter with random head weights, and the oracle builds an engine per arm (108 warnings on the
# tiny matrix); the tables say "random weights" per arm.
ENGINE_LOGGER = logging.getLogger("refengine")


class _Once(logging.Filter):
    """Lets each distinct message through once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


@contextmanager
def arm_runner(
    model_name: str,
    model: LoadedModel,
    block_size: int,
    jobs: int,
    device: str = "cpu",
    tensor_parallel_size: int = 1,
    ray_address: str | None = None,
) -> Iterator[Runner]:
    """`jobs` 1 runs the arms here, on `model`; more starts that many workers, each loading `model_name`
    once onto `device`. `tensor_parallel_size` > 1: each arm's engine runs on that many ranks. With
    `ray_address`, the arms are tasks on that Ray cluster instead (`jobs` is then the cluster's business)."""
    tensor_parallel = None if tensor_parallel_size == 1 else TensorParallel(model_name, tensor_parallel_size)
    if ray_address is not None:
        import ray

        # Ray's workers import refengine from this checkout, which every node must hold at the same path.
        root = str(Path(__file__).resolve().parents[2])
        ray.init(address=ray_address, runtime_env={"env_vars": {"PYTHONPATH": root, "OMP_NUM_THREADS": "1"}},
                 log_to_driver=False)
        try:
            yield RayRunner(block_size, tensor_parallel, model_name, device)
        finally:
            ray.shutdown()
        return
    if jobs == 1:
        once = _Once()
        ENGINE_LOGGER.addFilter(once)
        try:
            yield InProcessRunner(block_size, tensor_parallel, model)
        finally:
            ENGINE_LOGGER.removeFilter(once)
        return
    pool = ProcessPoolExecutor(
        jobs,
        # Not fork: a child forked after torch has run its OpenMP pool hangs in its first parallel region.
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(model_name, device),
    )
    try:
        yield PoolRunner(block_size, tensor_parallel, pool)
    finally:
        # After an error or Ctrl-C, the arms not yet started are dropped instead of run to the end.
        pool.shutdown(cancel_futures=True)


_worker_model: LoadedModel | None = None


def _init_worker(model_name: str, device: str) -> None:
    global _worker_model
    ENGINE_LOGGER.addFilter(_Once())  # the worker process's own logger: gone with the worker
    # One thread per worker: the workers already fill the cores, and more would only oversubscribe them.
    torch.set_num_threads(1)
    _worker_model = resolve_model(model_name, device)


def _run_in_ray_worker(
    model_name: str, device: str, arm: Arm, workload: Workload, block_size: int, tensor_parallel: TensorParallel | None
) -> ArmResult:
    # Ray gives each GPU task its own CUDA_VISIBLE_DEVICES: the task's GPU is always cuda:0 in the task.
    device = "cpu" if device == "cpu" else "cuda"
    if _worker_model is None:
        _init_worker(model_name, device)
    return _run_in_worker(arm, workload, block_size, tensor_parallel)


def _run_in_worker(arm: Arm, workload: Workload, block_size: int, tensor_parallel: TensorParallel | None) -> ArmResult:
    if _worker_model is None:
        raise RuntimeError("oracle worker used before its initializer loaded the model")
    return run_arm(_worker_model, arm, workload, block_size, tensor_parallel=tensor_parallel)
