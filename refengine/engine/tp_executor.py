"""MultiprocExecutor: tensor parallelism's processes. Rank 0 is this process (the engine core and its
shard); ranks 1..N-1 are spawned worker processes, each with its shard and a ModelRunner (tp_worker.py).
Every runner call is broadcast from rank 0 before rank 0 makes it, so every rank makes the same calls in
the same order (invariant 47); a rank that exits kills the engine with `rank K exited`.

Design: docs/design/architecture.md (tensor parallelism). Invariant numbers refer to docs/invariants.md.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from multiprocessing.connection import wait

import torch
import torch.distributed as dist

from refengine.core.outputs import GrammarOutput, ModelRunnerOutput, SchedulerOutput
from refengine.distributed.parallel_state import COLLECTIVE_TIMEOUT, init_process_group, set_nccl_safe_env
from refengine.engine.arg_utils import EngineArgs
from refengine.engine.outputs import EngineDeadError
from refengine.engine.tp_worker import (
    BuildRunner,
    ExecuteModel,
    SampleTokens,
    Shutdown,
    broadcast_call,
    worker_main,
)
from refengine.worker.async_output import AsyncModelRunnerOutput
from refengine.worker.runner import Runner

# How long rank 0 gives a failed collective's peers to show they exited, before it reports the failure
# as it came: a SIGKILLed peer's socket closes as it dies, so its exit is already there to see.
EXIT_GRACE_S = 10.0


class RankExitedError(EngineDeadError):
    """A worker rank's process ended: the group cannot step any more."""


class MultiprocExecutor:
    def __init__(self, world_size: int, device: torch.device, build_runner: BuildRunner, args: EngineArgs) -> None:
        """Starts ranks 1..world_size-1 running tp_worker.worker_main, each building its runner from
        `args` with `build_runner`, and joins their process group as rank 0."""
        set_nccl_safe_env()
        self.world_size = world_size
        self.healthy = True
        store = dist.TCPStore("127.0.0.1", 0, world_size, True, timeout=COLLECTIVE_TIMEOUT, wait_for_workers=False)
        context = multiprocessing.get_context("spawn")
        self.processes = [
            context.Process(
                target=worker_main, args=(rank, world_size, store.port, build_runner, args, device.type),
                name=f"refengine-tp-rank{rank}", daemon=True,
            )
            for rank in range(1, world_size)
        ]
        for process in self.processes:
            process.start()
        # Joining waits for every rank to load its shard; a rank that fails meanwhile would leave the
        # join waiting for the collective timeout, so the join runs aside while its exit is watched.
        groups: list[dist.ProcessGroup | None] = []
        joined = threading.Thread(
            target=lambda: groups.append(init_process_group(0, world_size, store, device)), daemon=True
        )
        joined.start()
        while joined.is_alive():
            joined.join(0.05)
            self._raise_if_exited(0.0)
        if not groups:
            raise RuntimeError("rank 0 could not join the tensor-parallel group (see the log above)")
        self.object_group = groups[0]

    def exited_rank(self, timeout: float) -> int | None:
        """The lowest rank whose process has ended (waiting up to `timeout` for one to), or None."""
        # A ready sentinel is an exit: the process may not be reapable yet (is_alive() still True) when its
        # closed socket has already failed rank 0's collective.
        ready = wait([p.sentinel for p in self.processes], timeout)
        dead = [rank for rank, p in enumerate(self.processes, start=1) if p.sentinel in ready]
        return min(dead) if dead else None

    def _raise_if_exited(self, timeout: float) -> None:
        rank = self.exited_rank(timeout)
        if rank is not None:
            self.healthy = False
            self.shutdown()
            raise RankExitedError(f"rank {rank} exited")

    @contextmanager
    def watch(self) -> Iterator[None]:
        """Collectives inside: a failure that a rank's exit explains is that exit."""
        try:
            yield
        except Exception:
            self.healthy = False
            self._raise_if_exited(EXIT_GRACE_S)
            raise

    def shutdown(self) -> None:
        """Every worker ends: asked to when the group is in step, killed otherwise; none is left behind."""
        if self.healthy and all(p.is_alive() for p in self.processes):
            self.healthy = False
            try:
                broadcast_call(Shutdown(), self.object_group)
            except RuntimeError:
                pass  # a rank went meanwhile: the kills below end the rest
        for process in self.processes:
            process.join(EXIT_GRACE_S if process.is_alive() else None)
            if process.is_alive():
                process.kill()
                process.join()
        if dist.is_initialized():
            dist.destroy_process_group()


class TensorParallelRunner:
    """Rank 0's runner: each call is broadcast to the other ranks, then made on this rank's runner."""

    def __init__(self, runner: Runner, executor: MultiprocExecutor) -> None:
        self.runner = runner
        self.executor = executor

    def execute_model(self, so: SchedulerOutput) -> None:
        with self.executor.watch():
            broadcast_call(ExecuteModel(so), self.executor.object_group)
            self.runner.execute_model(so)

    def sample_tokens(
        self,
        draft_overrides: Mapping[str, list[int]] | None = None,
        grammar_output: GrammarOutput | None = None,
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        with self.executor.watch():
            broadcast_call(SampleTokens(draft_overrides, grammar_output), self.executor.object_group)
            return self.runner.sample_tokens(draft_overrides, grammar_output)

    def take_draft_token_ids(self) -> dict[str, list[int]]:
        # Every rank holds the same drafts (invariant 45): the scheduler reads rank 0's.
        return self.runner.take_draft_token_ids()
