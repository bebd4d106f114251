"""TPGroup: one rank's view of its tensor-parallel group, and the few collectives the model and the runner
need. gloo on the CPU, NCCL on GPUs; nothing is sent by any other means.

Invariant numbers refer to docs/invariants.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# NVLink multicast (NCCL's NVLS, torch's symmetric-memory multicast) can take the GPUs of a shared host
# out of service: kept off in this process and in every process it starts (they inherit os.environ,
# and the spawned workers set it again before torch touches a GPU).
NCCL_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
# The TP-invariant mode's fixed tree: every row-parallel product sums K in this many slices, whatever
# the TP size (a TP size must divide it).
NUM_TP_INVARIANT_SLICES = 8
# How long a collective may wait for a peer that is alive; a dead peer's closed socket ends it at once.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


class TensorParallelConfigError(ValueError):
    """A tensor-parallel size that the model's shape cannot split."""


def set_nccl_safe_env() -> None:
    os.environ.update(NCCL_SAFE_ENV)


def init_process_group(
    rank: int, world_size: int, store: dist.Store | int, device: torch.device
) -> dist.ProcessGroup | None:
    """Join the group of `world_size` ranks: rank 0 passes the TCP store it serves, the others its port
    on 127.0.0.1. Returns the group that carries Python objects (the runner calls): None, the default
    group, on the CPU; beside NCCL, a gloo group, so that objects never travel through GPU memory."""
    set_nccl_safe_env()
    if isinstance(store, int):
        store = dist.TCPStore("127.0.0.1", store, world_size, False, timeout=COLLECTIVE_TIMEOUT)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT,
                                device_id=device)
        return dist.new_group(backend="gloo")
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
    return None


@dataclass(frozen=True, slots=True)
class TPGroup:
    """`world_size` 1 is a group of one (the TP-invariant mode at TP=1): every collective is the identity."""

    rank: int
    world_size: int
    invariant: bool  # row-parallel products reduce in NUM_TP_INVARIANT_SLICES slices, in a fixed tree

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The plain sum over ranks (its order is the backend's, and depends on the TP size)."""
        if self.distributed:
            dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `x`, in rank order."""
        if not self.distributed:
            return [x]
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous())
        return parts

    def warm_up(self, device: torch.device) -> None:
        """One collective on `device` before any CUDA graph is captured: NCCL builds its communicator on
        the first call, which a capture cannot hold."""
        if self.distributed:
            dist.all_reduce(torch.zeros(1, device=device))

    def broadcast_sampled(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Invariant 45: rank 0's sampled ids, on every rank. Every rank samples (each needs the ids to
        advance its own state and drafter), and a rank whose logits drifted would feed different
        tokens and poison the shared KV of every later step (vllm-ascend#11215): rank 0's ids win."""
        if self.distributed:
            dist.broadcast(token_ids, src=0)
        return token_ids


def check_tensor_parallel_size(
    tp: int, num_heads: int, num_kv_heads: int, vocab_size: int, intermediate_size: int, invariant: bool
) -> None:
    """One line saying why this model cannot be split `tp` ways."""
    if tp < 1:
        raise TensorParallelConfigError(f"tensor_parallel_size must be at least 1, got {tp}")
    for name, value in (
        ("attention heads", num_heads), ("KV heads", num_kv_heads), ("vocab size", vocab_size),
        ("intermediate size", intermediate_size),
    ):
        if value % tp:
            raise TensorParallelConfigError(f"tensor_parallel_size {tp} does not divide the model's {value} {name}")
    if invariant and NUM_TP_INVARIANT_SLICES % tp:
        raise TensorParallelConfigError(
            f"tp_invariant sums in {NUM_TP_INVARIANT_SLICES} slices: tensor_parallel_size {tp} does not divide them"
        )
