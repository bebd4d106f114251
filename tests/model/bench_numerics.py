"""Cost of batch-invariant vs fast numerics on SmolLM2 (not a test; numbers go to reports/).

    .venv/bin/python tests/model/bench_numerics.py [--threads N] [--repeats R]

Each figure is the minimum over R repeats, so other load on the machine inflates it least.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from refengine.model import AttentionMetadata, KVCache, Transformer, load_model
from refengine.model.ops import TILE_ROWS

BLOCK_SIZE = 16
CONTEXT = 128


def _timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def _prefill(model: Transformer, cache: KVCache, num_tokens: int) -> None:
    meta = AttentionMetadata.build([0], [num_tokens], [list(range(num_tokens // BLOCK_SIZE + 1))], BLOCK_SIZE)
    with torch.inference_mode():
        out = model(torch.arange(num_tokens) % 1000, torch.arange(num_tokens), meta, cache)
        model.compute_logits(out.hidden_states[-1:])


def _decode(model: Transformer, cache: KVCache, batch: int) -> None:
    """One decode token for each of `batch` sequences that already hold CONTEXT tokens."""
    blocks_per_seq = CONTEXT // BLOCK_SIZE + 1
    tables = [list(range(s * blocks_per_seq, (s + 1) * blocks_per_seq)) for s in range(batch)]
    meta = AttentionMetadata.build([CONTEXT] * batch, [1] * batch, tables, BLOCK_SIZE)
    with torch.inference_mode():
        out = model(torch.arange(batch) + 100, torch.full((batch,), CONTEXT), meta, cache)
        model.compute_logits(out.hidden_states)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, TILE_ROWS={TILE_ROWS}, capability {torch.backends.cpu.get_cpu_capability()}"
    )
    for numerics in ("batch_invariant", "fast"):
        model = load_model("smollm2", numerics=numerics).model
        results = _measure(model, args.repeats)
        print(numerics, "  ".join(f"{name}: {ms:.0f} ms" for name, ms in results.items()))


def _measure(model: Transformer, repeats: int) -> dict[str, float]:
    cache = KVCache.allocate(model.config, 16 * (CONTEXT // BLOCK_SIZE + 1), BLOCK_SIZE)
    return {
        "decode bs1": _timed(lambda: _decode(model, cache, 1), repeats),
        "decode bs16": _timed(lambda: _decode(model, cache, 16), repeats),
        f"prefill {CONTEXT}": _timed(lambda: _prefill(model, cache, CONTEXT), max(1, repeats // 2)),
    }


if __name__ == "__main__":
    main()
