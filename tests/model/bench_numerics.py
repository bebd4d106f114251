"""Cost of batch-invariant vs fast numerics on SmolLM2 (not a test; numbers go to reports/).

    .venv/bin/python tests/model/bench_numerics.py [--threads N] [--repeats R]

Each figure is the minimum over R repeats, so other load on the machine inflates it least. With
`--clock cpu` it is the process's CPU time instead of wall time: with one thread that is the compute
time even while other processes compete for the cores (with more threads it adds up all threads).
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from refengine.model import KVCache, Transformer, load_model, ops
from refengine.model.attention_metadata_builder import build_attention_metadata

BLOCK_SIZE = 16
CONTEXT = 128


def _timed(fn, repeats: int, clock) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best * 1e3


def _prefill(model: Transformer, cache: KVCache, num_tokens: int) -> None:
    meta = build_attention_metadata([0], [num_tokens], [list(range(num_tokens // BLOCK_SIZE + 1))], BLOCK_SIZE)
    with torch.inference_mode():
        out = model(torch.arange(num_tokens) % 1000, torch.arange(num_tokens), meta, cache)
        model.compute_logits(out.hidden_states[-1:])


def _decode(model: Transformer, cache: KVCache, batch: int) -> None:
    """One decode token for each of `batch` sequences that already hold CONTEXT tokens."""
    blocks_per_seq = CONTEXT // BLOCK_SIZE + 1
    tables = [list(range(s * blocks_per_seq, (s + 1) * blocks_per_seq)) for s in range(batch)]
    meta = build_attention_metadata([CONTEXT] * batch, [1] * batch, tables, BLOCK_SIZE)
    with torch.inference_mode():
        out = model(torch.arange(batch) + 100, torch.full((batch,), CONTEXT), meta, cache)
        model.compute_logits(out.hidden_states)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--tile-rows", type=int, default=ops.TILE_ROWS, help="try another tile height")
    parser.add_argument("--only", choices=["batch_invariant", "fast"], default=None)
    args = parser.parse_args()
    ops.TILE_ROWS = args.tile_rows
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, {args.clock} clock, TILE_ROWS={ops.TILE_ROWS}, capability {torch.backends.cpu.get_cpu_capability()}"
    )
    for numerics in [args.only] if args.only else ["batch_invariant", "fast"]:
        model = load_model("smollm2", numerics=numerics).model
        results = _measure(model, args.repeats, clock)
        print(numerics, "  ".join(f"{name}: {ms:.0f} ms" for name, ms in results.items()))


def _measure(model: Transformer, repeats: int, clock) -> dict[str, float]:
    cache = KVCache.allocate(model.config, 16 * (CONTEXT // BLOCK_SIZE + 1), BLOCK_SIZE)
    return {
        "decode bs1": _timed(lambda: _decode(model, cache, 1), repeats, clock),
        "decode bs16": _timed(lambda: _decode(model, cache, 16), repeats, clock),
        f"prefill {CONTEXT}": _timed(lambda: _prefill(model, cache, CONTEXT), max(1, repeats // 2), clock),
    }


if __name__ == "__main__":
    main()
