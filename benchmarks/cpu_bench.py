"""Decode throughput on the CPU: refengine (batch-invariant and fast) next to transformers' generate,
on the same SmolLM2 weights, prompts and thread count. A benchmark, not a test: it writes numbers.

    python benchmarks/cpu_bench.py [--concurrency 1,4,16] [--output-len 32] [--out reports/cpu-bench.md]
"""

import argparse
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

from refengine.engine.arg_utils import EngineArgs
from refengine.engine.engine_args import build_engine
from refengine.model.loader import embedded_smollm2_path
from refengine.request import Request
from refengine.sampling_params import SamplingParams

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash map handles collisions, with an example in Python.",
    "List five facts about the planet Mars and explain each one briefly.",
    "Describe the water cycle to a ten-year-old in a friendly tone.",
]


def prompt_ids(tokenizer, c: int) -> list[list[int]]:
    return [tokenizer.encode(PROMPTS[i % len(PROMPTS)] + f" (variant {i})") for i in range(c)]


NUMERICS = ("batch_invariant", "fast")


def decode_rate(engine, c: int, output_len: int, rep: int) -> float:
    """Output tokens per second over the decode steps only (every prompt already prefilled)."""
    core = engine.core
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for i, p in enumerate(prompt_ids(engine.loaded.tokenizer, c)):
        core.add_request(Request(f"{rep}-{i}", p, params, arrival_index=i))
    produced = 0
    while any(r.num_output_tokens == 0 for r in core.scheduler.requests.values()) or core.scheduler.waiting:
        core.step()
    start = time.perf_counter()
    while core.has_work():
        produced += sum(len(o.new_token_ids) for o in core.step().outputs)
    return produced / (time.perf_counter() - start)


def bench_refengine(c: int, output_len: int, repeats: int) -> dict[str, float]:
    """Median rate per numerics mode. The modes alternate repetition by repetition, so a change in the
    machine's load falls on both and their ratio holds better than their absolute rates."""
    engines = {
        numerics: build_engine(EngineArgs(numerics=numerics, max_num_seqs=c, max_model_len=512,
                                          num_blocks=c * 512 // 16 + 8, async_scheduling=False))
        for numerics in NUMERICS
    }
    rates: dict[str, list[float]] = {numerics: [] for numerics in NUMERICS}
    for rep in range(repeats):
        for numerics, engine in engines.items():
            rates[numerics].append(decode_rate(engine, c, output_len, rep))
    return {numerics: statistics.median(r) for numerics, r in rates.items()}


def bench_transformers(c: int, output_len: int, repeats: int) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_smollm2_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32).eval()
    texts = [PROMPTS[i % len(PROMPTS)] + f" (variant {i})" for i in range(c)]
    batch = tok(texts, return_tensors="pt", padding=True)

    def run(n: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(**batch, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
        return time.perf_counter() - start

    rates = []
    for _ in range(repeats):
        prefill = run(1)
        total = run(output_len)
        rates.append(c * (output_len - 1) / (total - prefill))
    return statistics.median(rates)


def context() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in line),
        platform.processor(),
    )
    load = Path("/proc/loadavg").read_text().split()[:3]
    return (
        f"- machine: {cpu}, {torch.get_num_threads()} torch threads, {platform.system()} {platform.release()}\n"
        f"- load average at the end (1/5/15 min): {' / '.join(load)}: other work on the machine inflates these times\n"
        f"- torch {torch.__version__}; commit {commit}; {time.strftime('%Y-%m-%d')}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    rows = []
    for c in levels:
        rates = bench_refengine(c, args.output_len, args.repeats)
        bi, fast = rates["batch_invariant"], rates["fast"]
        hf = bench_transformers(c, args.output_len, args.repeats)
        rows.append((c, bi, fast, hf))
        print(f"c={c}: batch-invariant {bi:.1f} tok/s, fast {fast:.1f} tok/s, transformers {hf:.1f} tok/s", flush=True)
    lines = [
        "# CPU decode throughput: SmolLM2-135M-Instruct (Q4_1 GGUF dequantised to fp32)",
        "",
        "Written by `make bench` (`benchmarks/cpu_bench.py`). Decode output tokens per second, measured after every",
        f"prompt is prefilled; greedy, {args.output_len} output tokens per request, prompts of about 20 tokens, median of",
        f"{args.repeats} runs, batch-invariant and fast alternating run by run. transformers runs `generate` on the same",
        "dequantised weights with the same threads and prompts (left-padded batch); its rate is",
        "(c x (N - 1)) / (time(N tokens) - time(1 token)).",
        "",
        context(),
        "| c | refengine batch-invariant | refengine fast | transformers generate | batch-invariant time per token / fast |",
        "|---|---|---|---|---|",
    ]
    for c, bi, fast, hf in rows:
        lines.append(f"| {c} | {bi:.1f} tok/s | {fast:.1f} tok/s | {hf:.1f} tok/s | {fast / bi:.2f}x |")
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
