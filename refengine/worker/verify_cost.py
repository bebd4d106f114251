"""The verify-cost table adaptive verification chooses by (spec_decode/adaptive_verification.py),
measured at start-up with the engine's own target step: for each batch size b and K = 0..k, b sequences
of `context_len` tokens each feed 1 + K tokens and sample every one, the way the dispatcher runs such a
step (a captured graph of its padded size on a GPU, eagerly on the CPU). Before any request runs, so
the KV it writes lands in free blocks. The best of a few timed steps per point, after one untimed one.
"""

import time

import numpy as np
import torch

from refengine.model.attention_metadata_builder import metadata_from_table
from refengine.model.device import on_device, to_device
from refengine.spec_decode.adaptive_verification import VerifyCostTable
from refengine.worker.device_inputs import DeviceInputIndices
from refengine.worker.model_runner import ModelRunner
from refengine.worker.target_step import forward


def cost_batch_sizes(max_num_seqs: int) -> list[int]:
    """Powers of two below max_num_seqs, and max_num_seqs: the table's rows (linear in between)."""
    return sorted({1 << i for i in range(max_num_seqs.bit_length()) if 1 << i < max_num_seqs} | {max_num_seqs})


def measure_verify_costs(
    runner: ModelRunner, batch_sizes: list[int], k: int, context_len: int, repeats: int = 2
) -> VerifyCostTable:
    with on_device(runner.device), torch.inference_mode():
        seconds = [[_time_step(runner, b, 1 + num, context_len, repeats) for num in range(k + 1)] for b in batch_sizes]
    return VerifyCostTable.monotone(batch_sizes, seconds)


def _time_step(runner: ModelRunner, num_seqs: int, q: int, context_len: int, repeats: int) -> float:
    block_size = runner.kv_cache.block_size
    num_blocks = -(-(context_len + q) // block_size)
    # Every sequence reads (and writes into) the same first blocks: what it reads is not the point.
    table = np.tile(np.arange(num_blocks, dtype=np.int64), (num_seqs, 1))
    meta, positions, seq_of_token = metadata_from_table(
        np.full(num_seqs, context_len, dtype=np.int64), np.full(num_seqs, q, dtype=np.int64), table,
        np.full(num_seqs, num_blocks, dtype=np.int64), block_size,
    )  # fmt: skip
    t = num_seqs * q
    ids, positions_t = torch.zeros(t, dtype=torch.int64), torch.from_numpy(positions)
    sample = torch.arange(t, dtype=torch.int64)
    none = DeviceInputIndices.build([], [], [-1] * num_seqs, [0] * num_seqs, seq_of_token)
    graph = runner.dispatcher.target_tokens(t, t, meta)
    capture_layers = () if runner.drafter is None else runner.drafter.capture_layers
    best = float("inf")
    for i in range(repeats + 1):
        _synchronize(runner.device)
        start = time.perf_counter()
        if graph is not None:
            # CUDA graphs exist only on a GPU: CPU mutation testing cannot reach this branch.
            # pragma: no mutate block
            runner.dispatcher.target.run(graph, ids, positions_t, meta, sample, none, None)
        else:
            dev = runner.device
            forward(runner.model, runner.kv_cache, to_device(ids, dev), to_device(positions_t, dev), to_device(meta, dev),
                    to_device(sample, dev), None, capture_layers)  # fmt: skip
        _synchronize(runner.device)
        if i:  # the first step warms up
            best = min(best, time.perf_counter() - start)
    return best


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
