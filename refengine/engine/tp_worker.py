"""A worker rank's process (tensor parallelism, tp_executor.py): builds its shard of the model and a
ModelRunner, then makes the runner calls rank 0 broadcasts, until rank 0 says stop or goes away."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import sys

from refengine.distributed.parallel_state import init_process_group, set_nccl_safe_env
from refengine.engine.arg_utils import EngineArgs
from refengine.engine.tp_executor import ExecuteModel, SampleTokens, Shutdown, broadcast_call

PR_SET_PDEATHSIG = 1


def worker_main(rank: int, world_size: int, port: int, args: EngineArgs, device_type: str) -> None:
    """Rank `rank` of `world_size`: on the CPU, or on GPU `rank` of this host."""
    set_nccl_safe_env()
    device = device_type if device_type == "cpu" else f"{device_type}:{rank}"
    if sys.platform == "linux":
        # The kernel kills this rank if rank 0's process dies without shutting it down (SIGKILL): no
        # worker outlives its engine.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    import torch
    import torch.distributed as dist

    from refengine.engine.engine_args import build_engine  # torch and the engine after the environment

    object_group = init_process_group(rank, world_size, port, torch.device(device))
    engine = build_engine(dataclasses.replace(args, device=device), tp_rank=rank)
    runner = engine.runner
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
