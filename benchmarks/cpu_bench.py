"""Decode throughput on the CPU: refengine (batch-invariant and fast) next to transformers' generate,
on the same SmolLM2 weights, prompts and thread count; and refengine's TPOT with async scheduling on
and off, without speculation and with the shipped EAGLE head. A benchmark, not a test: it writes numbers.

    python benchmarks/cpu_bench.py [--concurrency 1,4,16] [--output-len 32] [--async-concurrency 4]
                                   [--eagle-concurrency 1,4] [--out reports/cpu-bench.md]
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
from refengine.spec_decode.config import SpeculativeConfig

# The shipped EAGLE head of the embedded SmolLM2 (refengine/heads/smollm2/eagle), k = 3 drafts a step.
EAGLE = SpeculativeConfig("eagle", 3)

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


def build(numerics: str, c: int, async_scheduling: bool = False, spec: SpeculativeConfig | None = None):
    return build_engine(EngineArgs(numerics=numerics, max_num_seqs=c, max_model_len=512,
                                   num_blocks=c * 512 // 16 + 8, async_scheduling=async_scheduling,
                                   speculative_config=spec))


class TransformersPeer:
    """transformers' `generate` on the weights transformers itself dequantises from the same GGUF."""

    def __init__(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = embedded_smollm2_path()
        self.tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()

    def decode_rate(self, c: int, output_len: int) -> float:
        """(c x (N - 1)) / (time(N tokens) - time(1 token)): the decode steps only, as decode_rate."""
        texts = [PROMPTS[i % len(PROMPTS)] + f" (variant {i})" for i in range(c)]
        batch = self.tokenizer(texts, return_tensors="pt", padding=True)

        def run(n: int) -> float:
            start = time.perf_counter()
            with torch.inference_mode():
                self.model.generate(**batch, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                    pad_token_id=self.tokenizer.pad_token_id)
            return time.perf_counter() - start

        prefill = run(1)
        return c * (output_len - 1) / (run(output_len) - prefill)


def bench_level(c: int, output_len: int, repeats: int, peer: TransformersPeer) -> dict[str, float]:
    """Median rates of both numerics modes and transformers, which take turns repetition by repetition,
    so a change in the machine's load falls on all three; and the medians of the per-repetition ratios,
    which hold better than the rates."""
    engines = {numerics: build(numerics, c) for numerics in NUMERICS}
    rates: dict[str, list[float]] = {name: [] for name in (*NUMERICS, "transformers")}
    for rep in range(repeats):
        for numerics, engine in engines.items():
            rates[numerics].append(decode_rate(engine, c, output_len, rep))
        rates["transformers"].append(peer.decode_rate(c, output_len))
    row = {name: statistics.median(r) for name, r in rates.items()}
    row["fast/transformers"] = statistics.median(f / t for f, t in zip(rates["fast"], rates["transformers"]))
    row["fast/batch_invariant"] = statistics.median(f / b for f, b in zip(rates["fast"], rates["batch_invariant"]))
    return row


def tpot_ms(engine, c: int, output_len: int, rep: int) -> float:
    """Mean over requests of the time per output token after the first, through the engine's own front:
    depth 2 (step_with_batch_queue) under async scheduling, depth 1 (step) without."""
    core = engine.core
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for i, p in enumerate(prompt_ids(engine.loaded.tokenizer, c)):
        core.add_request(Request(f"tpot-{rep}-{i}", p, params, arrival_index=i))
    step = core.step_with_batch_queue if core.max_concurrent_batches > 1 else core.step
    arrivals: dict[str, list[tuple[float, int]]] = {}
    while core.has_work():
        outputs = step()
        now = time.perf_counter()
        for o in () if outputs is None else outputs.outputs:
            if o.new_token_ids:
                arrivals.setdefault(o.req_id, []).append((now, len(o.new_token_ids)))
    return statistics.mean(
        (times[-1][0] - times[0][0]) / (sum(n for _, n in times) - 1) * 1e3 for times in arrivals.values()
    )


def bench_async(c: int, output_len: int, repeats: int, spec: SpeculativeConfig | None = None) -> dict[str, float]:
    """Median TPOT (ms) of fast numerics with async scheduling off and on, taking turns repetition by
    repetition, and the median of the per-repetition ratios async / sync."""
    engines = {name: build("fast", c, on, spec) for name, on in (("sync", False), ("async", True))}
    # Both modes must have run as named, or the A/B compares one mode with itself.
    if engines["sync"].core.max_concurrent_batches != 1 or engines["async"].core.max_concurrent_batches != 2:
        raise RuntimeError("async scheduling was not on in exactly one of the two engines")
    for engine in engines.values():
        tpot_ms(engine, c, 4, -1)  # warm-up
    tpots: dict[str, list[float]] = {name: [] for name in engines}
    for rep in range(repeats):
        for name, engine in engines.items():
            tpots[name].append(tpot_ms(engine, c, output_len, rep))
    row = {name: statistics.median(t) for name, t in tpots.items()}
    row["async/sync"] = statistics.median(a / s for a, s in zip(tpots["async"], tpots["sync"]))
    runner = engines["async"].runner
    row["async_in_flight_steps"] = runner.num_in_flight_steps
    # Zero-bubble speculative steps: launched from the device's drafts and counts, none waited for.
    row["async_corrected_launches"] = runner.num_corrected_launches
    row["async_readback_steps"] = runner.num_readback_steps
    stats = engines["async"].core.scheduler.spec_decoding_stats
    row["acceptance_length"] = 1 + stats.num_accepted_tokens / max(1, stats.num_drafts)
    return row


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
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--async-concurrency", type=int, default=4)
    parser.add_argument("--eagle-concurrency", default="1,4")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    peer = TransformersPeer()
    rows = {}
    for c in (int(x) for x in args.concurrency.split(",")):
        row = rows[c] = bench_level(c, args.output_len, args.repeats, peer)
        print(f"c={c}: batch-invariant {row['batch_invariant']:.1f} tok/s, fast {row['fast']:.1f} tok/s, "
              f"transformers {row['transformers']:.1f} tok/s", flush=True)
    ab = bench_async(args.async_concurrency, args.output_len, args.repeats)
    print(f"c={args.async_concurrency}: TPOT sync {ab['sync']:.1f} ms, async {ab['async']:.1f} ms", flush=True)
    eagle = {}
    for c in (int(x) for x in args.eagle_concurrency.split(",")):
        row = eagle[c] = bench_async(c, args.output_len, args.repeats, EAGLE)
        print(f"c={c} EAGLE k={EAGLE.num_speculative_tokens}: TPOT sync {row['sync']:.1f} ms, async {row['async']:.1f} ms",
              flush=True)
    lines = [
        "# CPU decode throughput: SmolLM2-135M-Instruct (Q4_1 GGUF dequantised to fp32)",
        "",
        "Written by `make bench` (`benchmarks/cpu_bench.py`). Decode output tokens per second, measured after every",
        f"prompt is prefilled; greedy, {args.output_len} output tokens per request, prompts of about 20 tokens, median of",
        f"{args.repeats} runs; refengine batch-invariant, refengine fast and transformers take turns run by run, and",
        "each ratio is the median of the per-run ratios. transformers runs `generate` on the same dequantised",
        "weights with the same threads and prompts (left-padded batch); its rate is",
        "(c x (N - 1)) / (time(N tokens) - time(1 token)).",
        "",
        context(),
        "| c | refengine batch-invariant | refengine fast | transformers generate | fast / transformers | fast / batch-invariant |",
        "|---|---|---|---|---|---|",
    ]
    for c, row in rows.items():
        lines.append(
            f"| {c} | {row['batch_invariant']:.1f} tok/s | {row['fast']:.1f} tok/s | {row['transformers']:.1f} tok/s "
            f"| {row['fast/transformers']:.2f}x | {row['fast/batch_invariant']:.2f}x |"
        )
    lines += [
        "",
        f"Async scheduling at c = {args.async_concurrency}, fast numerics, same prompts and lengths: TPOT (mean over",
        "requests of the time per output token after the first) through the engine's own front, depth 2",
        "(`step_with_batch_queue`) with async scheduling on and depth 1 (`step`) with it off, taking turns run",
        f"by run ({ab['async_in_flight_steps']} async steps left their sampled ids in flight).",
        "",
        "| c | TPOT sync | TPOT async | async / sync |",
        "|---|---|---|---|",
        f"| {args.async_concurrency} | {ab['sync']:.1f} ms | {ab['async']:.1f} ms | {ab['async/sync']:.2f}x |",
        "",
        f"EAGLE (the shipped SmolLM2 head, k = {EAGLE.num_speculative_tokens}), async scheduling on and off, the same",
        "prompts, lengths and turns. Under async each spec step is launched from the previous step's device",
        "results (zero-bubble): 'corrected launches' counts steps whose positions the device moved back by the",
        "previous step's rejected drafts, 'waits' the spec steps whose results the runner waited for.",
        "",
        "| c | TPOT sync | TPOT async | async / sync | acceptance length | corrected launches | waits |",
        "|---|---|---|---|---|---|---|",
    ]
    for c, row in eagle.items():
        lines.append(
            f"| {c} | {row['sync']:.1f} ms | {row['async']:.1f} ms | {row['async/sync']:.2f}x "
            f"| {row['acceptance_length']:.2f} | {row['async_corrected_launches']} | {row['async_readback_steps']} |"
        )
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
