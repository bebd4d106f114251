"""reports/batch-invariance.md: what batch-invariant numerics do on the CPU and what they cost against fast
numerics on SmolLM2, per step and per tile. A benchmark, not a test: it writes numbers.

    python benchmarks/numerics_report.py [--threads N] [--repeats R] [--clock cpu] [--out reports/batch-invariance.md]

Each figure is the minimum over R repeats, so other load on the machine inflates it least. With
`--clock cpu` it is the process's CPU time instead of wall time: with one thread that is the compute
time even while other processes compete for the cores (with more threads it adds up all threads).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch

from ladder.host import provenance
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


PROSE = """\
`refengine.model` runs in one of two numerics modes, chosen when the model is built
(`load_model(..., numerics="batch_invariant" | "fast")`, default `batch_invariant`):

- **batch_invariant**: a token's logits are bitwise independent of the other tokens in the step and of how many
  of its own sequence's tokens arrive together (prefill in one go, chunks of 1, 3, 8, or a decode row next to
  someone else's prefill).
- **fast**: plain batched kernels.

Both modes match transformers within ||Δ||₂/||ref||₂ ≤ 1e-4 (tests/model/test_parity.py).

## What breaks invariance

1. **Matrix products.** `x[:1] @ W.T` can differ bitwise from `(X @ W.T)[:1]`: BLAS runs a gemv for one row and
   a gemm, with its own blocking, for several, and neither "any m ≥ 2 agrees" nor a row's alignment can be
   relied on. With a **fixed tile shape** `[T, K] @ W.T` a row's result is bitwise independent of its position
   in the tile and of the other rows' contents.
2. **Elementwise tails.** torch's vectorised loops finish a contiguous tensor's tail with scalar code; for
   `silu` and `sigmoid` the scalar and vector versions differ in the last bit, while `exp`, `sqrt`, `tanh` and
   `+ * /` agree.
3. **Reductions over the last dim** (`mean`, `sum`, `amax`, `softmax`) give the same bits for a row whatever
   the number of rows around it.
4. **Padded softmax/sum** would change the reduction's grouping with the padded length, which depends on the
   batch.

## What the model does (refengine/model/ops.py, attention.py)

- Every product in `batch_invariant` mode (`qkv_proj`, `o_proj`, `gate_up_proj`, `down_proj`, `lm_head`) runs
  as zero-padded tiles of exactly `TILE_ROWS` rows, one `torch.mm` call per tile (on CUDA tensors
  `GPU_TILE_ROWS` rows: there each tile is a kernel launch; this report measures the CPU only).
- `silu(gate) * up` is computed as `gate / (1 + exp(-gate)) * up`, RMSNorm as `x * (1 / sqrt(mean(x²) + eps)) * w`:
  only ops whose scalar and vector versions agree, in both modes.
- Rotary cos/sin come from a table built once for all positions: applying them is a gather and elementwise math.
- Attention reads every key back from the paged cache (also the ones written this step), and in
  `batch_invariant` mode computes each query row at position p on its own, over exactly keys `0..p` (or all
  `seq_len` keys when `causal=False`): every shape the row passes through depends on p alone.

The tests that would catch a regression: tests/model/test_batch_invariance.py (tiny llama and qwen3 models and
SmolLM2: a sequence alone, inside a batch of 8, and fed in chunks of 1, 3 and 8 tokens must give bitwise-equal
logits; a decode row next to another sequence's prefill likewise; the same check in `fast` mode fails, which
shows the test has teeth), tests/model/test_ops.py (the primitives row by row) and tests/model/test_paged_kv.py
(shuffled block tables give the logits of contiguous ones).
"""

# The report's rows: (label, numerics, TILE_ROWS); TILE_ROWS = 8 is the default.
CONFIGS = [(f"batch_invariant (TILE_ROWS = {ops.TILE_ROWS}, the default)", "batch_invariant", ops.TILE_ROWS),
           ("fast", "fast", ops.TILE_ROWS),
           ("batch_invariant, TILE_ROWS = 1 (one gemv per row)", "batch_invariant", 1),
           ("batch_invariant, TILE_ROWS = 4", "batch_invariant", 4),
           ("batch_invariant, TILE_ROWS = 16", "batch_invariant", 16)]
# SmolLM2's products, (K, N), and the tile heights timed for each.
PRODUCTS = {"qkv_proj": (576, 960), "o_proj": (576, 576), "gate_up_proj": (576, 3072), "down_proj": (1536, 576),
            "lm_head": (576, 49152)}
TILE_HEIGHTS = (1, 4, 8, 16)


def tile_ms(k: int, n: int, rows: int, repeats: int, clock) -> float:
    """One `torch.mm` of a [rows, K] tile against a [N, K] weight, the minimum over repeats of 10 calls each."""
    x, w = torch.randn(rows, k), torch.randn(n, k)
    return _timed(lambda: [torch.mm(x, w.T) for _ in range(10)], repeats, clock) / 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.set_num_threads(args.threads)
    default_tile = ops.TILE_ROWS
    steps = {}
    for label, numerics, tile_rows in CONFIGS:
        ops.TILE_ROWS = tile_rows
        steps[label] = _measure(load_model("smollm2", numerics=numerics).model, args.repeats, clock)
        print(label, "  ".join(f"{name}: {ms:.0f} ms" for name, ms in steps[label].items()), flush=True)
    ops.TILE_ROWS = default_tile
    tiles = {name: [tile_ms(k, n, rows, args.repeats, clock) for rows in TILE_HEIGHTS]
             for name, (k, n) in PRODUCTS.items()}
    text = report(args, steps, tiles)
    print(text)
    if args.out:
        args.out.write_text(text)


def report(args, steps: dict, tiles: dict) -> str:
    labels = [c[0] for c in CONFIGS]
    bi, fast = steps[labels[0]], steps[labels[1]]
    return "\n".join([
        "# Batch-invariant numerics on CPU: what breaks it, what we do, what it costs", "",
        provenance("batch-invariance-report"),
        f"torch {torch.__version__}, {platform.machine()}, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}; SmolLM2-135M-Instruct (Q4_1 GGUF dequantised to fp32, 30 layers, "
        "hidden 576, vocab 49152).", "",
        PROSE,
        "## Cost", "",
        f"SmolLM2, fp32, context {CONTEXT} for decode, block size {BLOCK_SIZE}. Each figure is the minimum over "
        f"{args.repeats} runs (prefill: {max(1, args.repeats // 2)}) of the process's {args.clock} time with "
        f"{args.threads} thread(s): with one thread, CPU time is what the step costs with a core to itself, "
        "whatever else runs on the machine.", "",
        f"| mode | decode, batch 1 | decode, batch 16 | prefill, {CONTEXT} tokens |",
        "| --- | --- | --- | --- |",
        *(f"| {label} | " + " | ".join(f"{ms:.0f} ms" for ms in steps[label].values()) + " |" for label in labels),
        "",
        "(Prefill includes the logits of the last position only; decode includes all rows' logits.)", "",
        f"Per-call cost of one tile, {args.threads} thread(s), {args.clock} time, ms:", "",
        "| (K, N) | " + " | ".join(f"{r} row{'s' if r > 1 else ''}" for r in TILE_HEIGHTS) + " |",
        "| --- |" + " --- |" * len(TILE_HEIGHTS),
        *(f"| {PRODUCTS[name]} `{name}` | " + " | ".join(f"{ms:.3f}" for ms in row) + " |" for name, row in tiles.items()),
        "",
        f"Batch-invariant at TILE_ROWS = {ops.TILE_ROWS} costs {bi['decode bs1'] / fast['decode bs1']:.2f}x fast's step "
        f"at batch 1, {bi['decode bs16'] / fast['decode bs16']:.2f}x at batch 16 and "
        f"{bi[f'prefill {CONTEXT}'] / fast[f'prefill {CONTEXT}']:.2f}x in a {CONTEXT}-token prefill. TILE_ROWS is set "
        "in `refengine/model/ops.py`; end to end, `reports/cpu-bench.md` has both modes' decode rates.", ""])


def _measure(model: Transformer, repeats: int, clock) -> dict[str, float]:
    cache = KVCache.allocate(model.config, 16 * (CONTEXT // BLOCK_SIZE + 1), BLOCK_SIZE)
    return {
        "decode bs1": _timed(lambda: _decode(model, cache, 1), repeats, clock),
        "decode bs16": _timed(lambda: _decode(model, cache, 16), repeats, clock),
        f"prefill {CONTEXT}": _timed(lambda: _prefill(model, cache, CONTEXT), max(1, repeats // 2), clock),
    }


if __name__ == "__main__":
    main()
