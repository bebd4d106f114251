"""Runs batches of oracle arms, in this process or in a pool of worker processes. Arms are independent
engine runs, so only where they run changes; results come back in the order the arms were given."""

import logging
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass

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
class InProcessRunner:
    model: LoadedModel
    block_size: int
    tensor_parallel: TensorParallel | None = None

    def run(self, jobs: Sequence[Job], on_done: OnDone) -> list[ArmResult]:
        results = []
        for arm, workload in jobs:
            results.append(run_arm(self.model, arm, workload, self.block_size, tensor_parallel=self.tensor_parallel))
            on_done(workload, results[-1])
        return results


@dataclass(frozen=True)
class PoolRunner:
    pool: ProcessPoolExecutor
    block_size: int
    tensor_parallel: TensorParallel | None = None

    def run(self, jobs: Sequence[Job], on_done: OnDone) -> list[ArmResult]:
        futures: dict[Future[ArmResult], Workload] = {
            self.pool.submit(_run_in_worker, arm, workload, self.block_size, self.tensor_parallel): workload
            for arm, workload in jobs
        }
        for future in as_completed(futures):
            on_done(futures[future], future.result())
        return [future.result() for future in futures]


Runner = InProcessRunner | PoolRunner


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
    model_name: str, model: LoadedModel, block_size: int, jobs: int, device: str = "cpu", tensor_parallel_size: int = 1
) -> Iterator[Runner]:
    """`jobs` 1 runs the arms here, on `model`; more starts that many workers, each loading `model_name`
    once onto `device`. `tensor_parallel_size` > 1: each arm's engine runs on that many ranks."""
    tensor_parallel = None if tensor_parallel_size == 1 else TensorParallel(model_name, tensor_parallel_size)
    if jobs == 1:
        once = _Once()
        ENGINE_LOGGER.addFilter(once)
        try:
            yield InProcessRunner(model, block_size, tensor_parallel)
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
        yield PoolRunner(pool, block_size, tensor_parallel)
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


def _run_in_worker(arm: Arm, workload: Workload, block_size: int, tensor_parallel: TensorParallel | None) -> ArmResult:
    if _worker_model is None:
        raise RuntimeError("oracle worker used before its initializer loaded the model")
    return run_arm(_worker_model, arm, workload, block_size, tensor_parallel=tensor_parallel)
