"""Tensor parallelism's decode cost: TPOT at each TP size and concurrency, against the floor of reading one
rank's weights once per step at the measured copy bandwidth; optionally the TP-invariant mode beside the
plain all-reduce, and EAGLE with synthetic acceptance. A benchmark, not a test: it writes numbers.

TPOT here is the decode time per output token of one request: (wall of a run to `output_len` tokens - wall
of the same run to 1 token) / (output_len - 1), every request of the batch starting together.

    # the CPU cost of --tp-invariant (gloo, fp32, batch-invariant numerics); random:qwen3-0.6b works too,
    # at seconds per token on two shared cores
    python benchmarks/tp_bench.py --device cpu --model tiny-qwen3 --dtype float32 --tensor-parallel-size 1,2 \\
        --modes plain,tp_invariant --c 1,4 --prompt-len 16 --output-len 16 --out reports/tp-invariant-cost.md
    # 2 GPUs of one host: qwen3-32b's shape, random bf16 weights, 1024 in / 256 out
    python benchmarks/tp_bench.py --device cuda --model random:qwen3-32b --dtype bfloat16 --tensor-parallel-size 2,1 \\
        --modes fast --c 1,8,32 --prompt-len 1024 --output-len 256 --out reports/gpu-tp-tpot.md

`make tp-cost-report` and `make tp-report-gpu` run these.
"""

import argparse
import dataclasses
import gc
import json
import platform
import time
from pathlib import Path

import torch

from ladder.host import provenance
from ladder.own_version import build
from refengine.distributed.parallel_layers import local_config
from refengine.engine.llm import LLM
from refengine.model.config import ModelConfig
from refengine.model.loader import load_model
from refengine.model.roofline import weight_bytes_per_step
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig

# numerics and tp_invariant of each mode
MODES = {"fast": ("fast", False), "plain": ("batch_invariant", False), "tp_invariant": ("batch_invariant", True)}


def copy_bandwidth(device: str) -> float:
    """Bytes per second read + written by a 1 GiB device-to-device copy (median of 10)."""
    src = torch.randn(2**28, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() * 4 / sorted(times[2:])[len(times[2:]) // 2]


def floor_ms(config: ModelConfig, tp: int, dtype: torch.dtype, bandwidth: float) -> float:
    """One rank's weights (its heads, columns and vocabulary slice) read once, at `bandwidth`."""
    shard = dataclasses.replace(local_config(config, tp), vocab_size=config.vocab_size // tp)
    return weight_bytes_per_step(shard, dtype) / bandwidth * 1e3


def tpot_ms(llm: LLM, c: int, prompt_len: int, output_len: int, vocab: int) -> tuple[float, float]:
    """(TPOT, tokens per request per engine step) of c requests of `prompt_len` random tokens."""
    generator = torch.Generator().manual_seed(c)
    prompts = [torch.randint(0, vocab, (prompt_len,), generator=generator).tolist() for _ in range(c)]
    walls = {}
    for n in (1, output_len):
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))  # warm-up
        steps = llm.engine.runner.num_steps
        t0 = time.perf_counter()
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        walls[n] = (time.perf_counter() - t0, llm.engine.runner.num_steps - steps)
    decode_steps = walls[output_len][1] - walls[1][1]
    return (walls[output_len][0] - walls[1][0]) / (output_len - 1) * 1e3, (output_len - 1) / max(decode_steps, 1)


def engine_rows(args, config: ModelConfig, tp: int, mode: str, spec, concurrencies: list[int], bandwidth: float):
    numerics, invariant = MODES[mode]
    dtype = getattr(torch, args.dtype)
    max_len = args.prompt_len + args.output_len + 16
    llm = LLM(args.model, device=args.device, dtype=args.dtype, numerics=numerics, tp_invariant=invariant,
              tensor_parallel_size=tp, max_num_seqs=max(concurrencies), max_model_len=max_len, speculative_config=spec,
              synthetic_acceptance_rate=None if spec is None else args.synthetic_acceptance,
              kv_cache_memory_gib=_kv_gib(config, tp, max(concurrencies), max_len + 48, dtype))
    rows = []
    try:
        for c in concurrencies:
            ms, per_step = tpot_ms(llm, c, args.prompt_len, args.output_len, config.vocab_size)
            row = dict(tp=tp, mode=mode, spec=None if spec is None else f"eagle k={spec.num_speculative_tokens}",
                       c=c, tpot_ms=round(ms, 3), tokens_per_step=round(per_step, 2),
                       floor_ms=round(floor_ms(config, tp, dtype, bandwidth) / per_step, 3))
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        llm.engine.core.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--model", default="random:qwen3-0.6b")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--tensor-parallel-size", default="1,2", help="TP sizes, comma-separated")
    parser.add_argument("--modes", default="plain,tp_invariant", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--c", default="1,4", help="concurrencies, comma-separated")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--eagle-k", type=int, default=0, help="also run EAGLE with k drafts at this synthetic rate")
    parser.add_argument("--synthetic-acceptance", type=float, default=0.7)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target", help="the make target running this command, named in the report")
    args = parser.parse_args()
    config = _shape(args.model) if args.model.startswith("random:") else load_model(args.model).config
    bandwidth = copy_bandwidth(args.device)
    commit = build().commit
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or platform.machine()
    rows = []
    specs = [None] + ([SpeculativeConfig("eagle", args.eagle_k)] if args.eagle_k else [])
    concurrencies = list(map(int, args.c.split(",")))
    for tp in map(int, args.tensor_parallel_size.split(",")):
        for mode in args.modes.split(","):
            for spec in specs:
                rows += engine_rows(args, config, tp, mode, spec, concurrencies, bandwidth)
                # One engine's weights at a time on the device: the next one loads its own.
                gc.collect()
                if args.device == "cuda":
                    torch.cuda.empty_cache()
    header = (
        f"# Tensor-parallel decode: {args.model}, {args.dtype}, {args.prompt_len} in / {args.output_len} out\n\n"
        f"{provenance(args.target)}\n"
        f"{device_name} ({args.device}), torch {torch.__version__}, {torch.get_num_threads()} torch thread(s) per rank; "
        f"measured copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write). Floor: one rank's weight bytes read once "
        "per step at that bandwidth, per token (divided by tokens per step).\n\n"
        "| TP | mode | spec | c | TPOT ms | tokens / step | floor ms |\n|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['tp']} | {r['mode']} | {r['spec'] or '-'} | {r['c']} | {r['tpot_ms']} | {r['tokens_per_step']} | {r['floor_ms']} |\n"
        for r in rows
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(header + body)
    args.out.with_suffix(".json").write_text(json.dumps({"commit": commit, "rows": rows}, indent=1))


def _shape(name: str) -> ModelConfig:
    from refengine.model.shapes import SHAPES, shape_name

    return SHAPES[shape_name(name)]


def _kv_gib(config: ModelConfig, tp: int, c: int, tokens: int, dtype: torch.dtype) -> float:
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads // tp * config.head_dim * dtype.itemsize
    return c * tokens * per_token / 2**30 + 0.25


if __name__ == "__main__":
    main()
