"""A worker rank's process (tensor parallelism, tp_executor.py): builds its shard of the model and a
ModelRunner, then makes the runner calls rank 0 broadcasts, until rank 0 says stop or goes away.

The worker is handed the function that builds its runner (engine_args's, passed by rank 0 through the
spawn) rather than importing it: the engine imports the executor, and nothing here imports back."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from refengine.core.outputs import GrammarOutput, SchedulerOutput
from refengine.distributed.parallel_state import init_process_group, set_nccl_safe_env
from refengine.engine.arg_utils import EngineArgs
from refengine.worker.runner import Runner

PR_SET_PDEATHSIG = 1

# (the rank's EngineArgs, its rank) -> the runner of its engine. A module-level function, so that the
# spawn can pickle it by name.
BuildRunner = Callable[[EngineArgs, int], Runner]


@dataclass(frozen=True, slots=True)
class ExecuteModel:
    scheduler_output: SchedulerOutput


@dataclass(frozen=True, slots=True)
class SampleTokens:
    draft_overrides: Mapping[str, list[int]] | None
    grammar_output: GrammarOutput | None


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


RunnerCall = ExecuteModel | SampleTokens | Shutdown


def broadcast_call(call: RunnerCall | None, group: dist.ProcessGroup | None) -> RunnerCall:
    """Rank 0 sends `call`; every other rank passes None and gets it. `group`: the objects' group
    (parallel_state.init_process_group)."""
    box = [call]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def worker_main(
    rank: int, world_size: int, port: int, build_runner: BuildRunner, args: EngineArgs, device_type: str
) -> None:
    """Rank `rank` of `world_size`: on the CPU, or on GPU `rank` of this host."""
    set_nccl_safe_env()
    device = device_type if device_type == "cpu" else f"{device_type}:{rank}"
    if sys.platform == "linux":
        # The kernel kills this rank if rank 0's process dies without shutting it down (SIGKILL): no
        # worker outlives its engine.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    object_group = init_process_group(rank, world_size, port, torch.device(device))
    runner = build_runner(dataclasses.replace(args, device=device), rank)
    try:
        while True:
            call = broadcast_call(None, object_group)
            if isinstance(call, ExecuteModel):
                runner.execute_model(call.scheduler_output)
            elif isinstance(call, SampleTokens):
                runner.sample_tokens(call.draft_overrides, call.grammar_output)
            elif isinstance(call, Shutdown):
                dist.destroy_process_group()
                # Nothing is left to flush or free that the exit does not: skip the interpreter's slow
                # teardown of torch, which rank 0 would wait for.
                os._exit(0)
    except RuntimeError as err:
        # Rank 0 went away mid-collective: nothing to report to, and nobody to wait for.
        sys.exit(f"refengine tensor-parallel rank {rank}: {str(err).splitlines()[0]}")
