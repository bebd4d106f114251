"""What the TP-invariant reduction costs against the plain all-reduce, one row-parallel product at a time:
qwen3-0.6b's down_proj (K = 3072 -> N = 1024, fp32, batch-invariant tiles) at T tokens, on TP = 1 and 2
ranks (gloo, spawned processes), the two modes taking turns repetition by repetition so that the machine's
load falls on both alike. A benchmark, not a test: it writes numbers.

    python benchmarks/tp_layer_bench.py --out reports/tp-invariant-layer.md

`make tp-layer-report` runs it.
"""

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ladder.host import provenance
from refengine.distributed.parallel_layers import RowParallelLinear
from refengine.distributed.parallel_state import TPGroup, init_process_group
from refengine.model.config import Numerics

K, N = 3072, 1024
TOKENS = (1, 8, 64)
REPS = 30
WARMUP = 5


def rank_main(rank: int, world_size: int, port: int, queue) -> None:
    torch.set_num_threads(1)
    if world_size > 1:
        init_process_group(rank, world_size, port, torch.device("cpu"))
    weight = torch.randn(N, K, generator=torch.Generator().manual_seed(0)) / K**0.5
    shard = weight[:, rank * K // world_size : (rank + 1) * K // world_size]
    layers = {
        mode: RowParallelLinear(shard, Numerics.BATCH_INVARIANT, TPGroup(rank, world_size, invariant=mode == "tp_invariant"))
        for mode in ("plain", "tp_invariant")
    }
    results = {}
    for t in TOKENS:
        x = torch.randn(t, K // world_size, generator=torch.Generator().manual_seed(t))
        times: dict[str, list[float]] = {mode: [] for mode in layers}
        for layer in layers.values():  # warm-up: first calls allocate and pack
            for _ in range(WARMUP):
                layer(x)
        for _ in range(REPS):
            for mode, layer in layers.items():
                if world_size > 1:
                    dist.barrier()
                t0 = time.perf_counter()
                layer(x)
                times[mode].append((time.perf_counter() - t0) * 1e3)
        results[t] = {mode: statistics.median(v) for mode, v in times.items()}
    if rank == 0:
        queue.put(results)
    if world_size > 1:
        dist.destroy_process_group()


def run(world_size: int) -> dict:
    context = mp.get_context("spawn")
    queue = context.Queue()
    store = dist.TCPStore("127.0.0.1", 0, world_size, True, wait_for_workers=False) if world_size > 1 else None
    port = 0 if store is None else store.port
    procs = [context.Process(target=rank_main, args=(r, world_size, port, queue)) for r in range(world_size)]
    for p in procs:
        p.start()
    results = queue.get()
    for p in procs:
        p.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    lines = [
        "# The TP-invariant reduction against the plain all-reduce, per row-parallel product (CPU)\n\n",
        "",  # provenance, written at the end with the load average then
        f"torch {torch.__version__}, 1 thread per rank, gloo; 1-minute load average {load_start:.1f} at the start. qwen3-0.6b's down_proj ({K} -> {N}, fp32, "
        f"batch-invariant 8-row tiles), median of {REPS} repetitions after {WARMUP} of warm-up, the modes taking turns. Plain: the rank's "
        "product, then one all-reduce. TP-invariant: 8 slice products summed in a fixed tree, the rank subtrees "
        "all-gathered and added in rank order.\n\n",
        "| TP | tokens | plain ms | tp_invariant ms | ratio |\n|---|---|---|---|---|\n",
    ]
    for world_size in (1, 2):
        for t, r in run(world_size).items():
            lines.append(f"| {world_size} | {t} | {r['plain']:.3f} | {r['tp_invariant']:.3f} | "
                         f"{r['tp_invariant'] / r['plain']:.2f} |\n")
            print(lines[-1], end="", flush=True)
    lines[1] = f"{provenance('tp-layer-report')}\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(lines))


if __name__ == "__main__":
    main()
