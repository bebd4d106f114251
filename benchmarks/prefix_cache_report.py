"""reports/prefix-cache.md: TTFT with refengine's prefix cache on and off, on the CPU with the embedded SmolLM2,
through `ladder run` against `refengine serve`. A benchmark, not a test: it writes numbers.
With --gpu: reports/prefix-cache-h200.md, the shared-prefix workload at GPU scale (random qwen3-8b, bf16).

Two workloads, each laddered at c = 1 with the cache on (the default) and off (--no-enable-prefix-caching):
- multi-turn ShareGPT sessions (--multi-turn): each turn resends the conversation so far, so from turn 2 on
  the server can serve the history from its cache; TTFT by turn;
- the shared-prefix workload (--prefix-len): every prompt starts with the same long prefix.

    python benchmarks/prefix_cache_report.py [--turns 5] [--sessions 4] [--out reports/prefix-cache.md]
    python benchmarks/prefix_cache_report.py --gpu [--bin DIR] [--out reports/prefix-cache-h200.md]
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ladder.host import cpu_model
from ladder.own_version import build

CACHE_OFF = "--no-enable-prefix-caching"
# The GPU workload: an 8,192-token prefix shared by every request (a long system prompt or a RAG context), a
# 128-token suffix of its own, 64 output tokens; c = 1 and 8, 4 measured requests per concurrency.
GPU_SERVE = ("refengine serve --device cuda --model random:qwen3-8b --dtype bfloat16 --fast --max-num-seqs 8 "
             "--max-model-len 16384 --kv-cache-memory-gib 24 --port {port}")
GPU_LADDER = ["--c", "1,8", "--dataset", "random", "--prefix-len", "8192", "--num-prefixes", "1", "--input-len",
              "128", "--output-len", "64", "--prompts-per-concurrency", "4", "--seed", "0"]


@dataclass(frozen=True)
class Arm:
    label: str
    serve_cmd: str  # without the bin folder: command() puts it in front
    args: list[str]
    bin: Path  # where `refengine` and `ladder` are

    def command(self, out: Path) -> list[str]:
        return [f"{self.bin}/ladder", "run", "--serve-cmd", f"{self.bin}/{self.serve_cmd}", "--label", self.label,
                "--out", str(out), "--overwrite", *self.args]


def export_tokenizer(folder: Path) -> None:
    """SmolLM2's own tokenizer, from its GGUF, for --tokenizer (ShareGPT turns are counted with it)."""
    from refengine.model.gguf_loader import read_gguf
    from refengine.model.loader import embedded_smollm2_path
    from refengine.tokenizer.tokenizer import Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    Tokenizer.from_gguf_vocab(read_gguf(embedded_smollm2_path()).vocab).save_hf_folder(folder)


def run(arm: Arm, runs: Path) -> list[dict]:
    """Ladder one arm; its rungs' rows, every one OK."""
    out = runs / arm.label
    print(f"== {arm.label}: {shlex.join(arm.command(out))}", flush=True)
    subprocess.run(arm.command(out), check=True)
    rungs = json.loads((out / "rungs.json").read_text())
    for rung in rungs:
        if rung["status"] != "OK":
            raise SystemExit(f"{arm.label}: rung c={rung['concurrency']} {rung['status']} ({rung.get('reason')})")
    return rungs


def percentile(stats: dict, key: str, q: str) -> float:
    """A metric's percentile from a rung's (or a turn's) statistics, as rungs.json writes them."""
    return stats[key]["percentiles"][q]


def ms(value: float) -> str:
    return f"{value:,.0f}"


def hit_rate(rung: dict) -> str:
    cache = rung.get("prefix_cache")
    if cache is None or cache["hit_rate"] is None:
        return "n/a (the counters stay at 0)" if cache is not None else "n/a"
    return f"{100 * cache['hit_rate']:.0f} % ({cache['hits']:,.0f} of {cache['queries']:,.0f})"


def command_line(arm: Arm) -> str:
    """The arm's command as a reader would type it (paths and the out dir left out)."""
    return shlex.join(["ladder", "run", "--serve-cmd", arm.serve_cmd, *arm.args])


def multi_turn_section(on: dict, off: dict, arms: tuple[Arm, Arm], turns: int, sessions: int) -> list[str]:
    rows = []
    for t in map(str, range(1, turns + 1)):
        a, b = on["turns"][t], off["turns"][t]
        ratio = percentile(a, "ttft_ms", "p50") / percentile(b, "ttft_ms", "p50")
        rows.append(f"| {t} | {a['input_tokens']['mean']:,.0f} | {a['cached_tokens']['mean']:,.0f} | "
                    f"{ms(percentile(a, 'ttft_ms', 'p50'))} | {ms(percentile(b, 'ttft_ms', 'p50'))} | "
                    f"{ratio:.2f}x |")
    last = str(turns)
    final = percentile(on["turns"][last], "ttft_ms", "p50") / percentile(off["turns"][last], "ttft_ms", "p50")
    return [
        "## Multi-turn ShareGPT sessions, c = 1: TTFT by turn", "",
        f"{sessions} ShareGPT conversations of at least {turns} turns (1 more as warmup), each laddered as a session "
        f"of its first {turns} human turns in order (each at most 128 tokens, counted with SmolLM2's own "
        "tokenizer); every turn resends the conversation so far with the server's real reply to each earlier "
        "turn (32 tokens, ignore_eos), then the next human turn. A per-session cache-bust tag leads each "
        "session's first message. One session at a time (c = 1).", "",
        "```", *(command_line(a) for a in arms), "```", "",
        "| turn | prompt tokens (mean) | cached tokens, cache on (mean) | TTFT p50, cache on (ms) | "
        "TTFT p50, cache off (ms) | on / off |",
        "|---:|---:|---:|---:|---:|---:|", *rows, "",
        f"Prefix cache hit rate over all turns, from /metrics: on {hit_rate(on)}; off {hit_rate(off)}.", "",
        f"**TTFT at turn {turns} with the cache on is {final:.2f}x the cache-off TTFT** (the aim: at most 0.5x). "
        "Turn 1 has no history to reuse; from turn 2 on the cache serves the history up to the last whole block "
        "before the newest reply, and the server computes the rest.", ""]


def shared_prefix_section(on: dict, off: dict, arms: tuple[Arm, Arm]) -> list[str]:
    p50 = lambda r: percentile(r["stats"], "ttft_ms", "p50")  # noqa: E731
    p90 = lambda r: percentile(r["stats"], "ttft_ms", "p90")  # noqa: E731
    return [
        "## Shared prefix, c = 1: TTFT with a cached shared prefix", "",
        "The ladder's shared-prefix workload: every prompt is a ~512-token prefix shared by every request of the "
        "run, then a 64-token random suffix (the run's cache-bust tag in front), 4 output tokens, 1 warmup + "
        "4 measured requests.", "",
        "```", *(command_line(a) for a in arms), "```", "",
        "| prefix caching | prompt tokens (mean) | TTFT p50 / p90 (ms) | prefix cache hit rate (tokens, from /metrics) |",
        "|---|---:|---|---|",
        f"| on (default) | {on['stats']['input_tokens']['mean']:,.0f} | {ms(p50(on))} / {ms(p90(on))} | {hit_rate(on)} |",
        f"| off (`{CACHE_OFF}`) | {off['stats']['input_tokens']['mean']:,.0f} | {ms(p50(off))} / {ms(p90(off))} | "
        f"{hit_rate(off)} |", "",
        f"TTFT with the prefix cached is {p50(on) / p50(off):.2f}x the cold TTFT.", ""]


def mean_cached_tokens(out: Path, concurrency: int) -> float:
    """usage.prompt_tokens_details.cached_tokens over a rung's measured requests, as the client saw it."""
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    cached = [r["cached_tokens"] or 0 for r in records if r["concurrency"] == concurrency and r["phase"] == "measured"]
    return sum(cached) / len(cached)


def gpu_section(on: list[dict], off: list[dict], arms: tuple[Arm, Arm], runs: Path) -> list[str]:
    pct = lambda r, key, q: percentile(r["stats"], key, q)  # noqa: E731
    rows, ratios = [], []
    for a, b in zip(on, off, strict=True):
        ratio = pct(a, "ttft_ms", "p50") / pct(b, "ttft_ms", "p50")
        ratios.append(f"{ratio:.2f}x at c = {a['concurrency']}")
        for label, r, arm in (("on (default)", a, arms[0]), (f"off (`{CACHE_OFF}`)", b, arms[1])):
            cached = mean_cached_tokens(runs / arm.label, r["concurrency"])
            rows.append(f"| {r['concurrency']} | {label} | {r['stats']['input_tokens']['mean']:,.0f} | "
                        f"{cached:,.0f} | {ms(pct(r, 'ttft_ms', 'p50'))} / {ms(pct(r, 'ttft_ms', 'p90'))} | "
                        f"{pct(r, 'tpot_ms', 'p50'):.2f} | {hit_rate(r)} |")
    return [
        "## Shared prefix at GPU scale: TTFT with an 8,192-token cached prefix", "",
        "Every prompt is the same 8,192-token prefix (the run's cache-bust tag in front, so it is shared within the "
        "run and never with another run), then a 128-token random suffix of its own; 64 output tokens (ignore_eos); "
        "c requests at once, c warmup requests and 4·c measured per rung.", "",
        "```", *(command_line(a) for a in arms), "```", "",
        "| c | prefix caching | prompt tokens (mean) | cached tokens (usage, mean) | TTFT p50 / p90 (ms) | TPOT p50 (ms) | "
        "prefix cache hit rate (tokens, from /metrics) |",
        "|---:|---|---:|---:|---|---:|---|", *rows, "",
        f"**TTFT p50 with the prefix cached, over the cold TTFT: {'; '.join(ratios)}.**", ""]


def gpu_main(opts: argparse.Namespace) -> None:
    import torch

    arms = (Arm("h200-shared-prefix-cache-on", GPU_SERVE, GPU_LADDER, opts.bin),
            Arm("h200-shared-prefix-cache-off", f"{GPU_SERVE} {CACHE_OFF}", GPU_LADDER, opts.bin))
    start = time.time()
    on, off = (run(a, opts.runs) for a in arms)
    lines = [
        "# Prefix caching at GPU scale: H200, random qwen3-8b", "",
        f"Made by `make prefix-cache-report-gpu` (benchmarks/prefix_cache_report.py --gpu) on "
        f"{f'the tree of commit {opts.commit}' if opts.commit else build().describe()}, "
        f"engine of the same tree, {time.strftime('%Y-%m-%d')}, on one {torch.cuda.get_device_name(0)} with {cpu_model()} x{os.cpu_count()}, "
        f"{(time.time() - start) / 60:.1f} minutes in all. Model: qwen3-8b's shape with random weights, bfloat16, "
        "fast numerics, CUDA graphs; `refengine serve` through HTTP, one server at a time. The CPU figures "
        "(multi-turn ShareGPT sessions, SmolLM2) are in [prefix-cache.md](prefix-cache.md).", ""]
    lines += gpu_section(on, off, arms, opts.runs)
    opts.out.write_text("\n".join(lines))
    print(f"wrote {opts.out}")


def cpu_main(opts: argparse.Namespace) -> None:
    serve = "refengine serve --model smollm2 --port {port} --threads 1 --max-num-seqs 4"
    tokenizer = opts.runs / "tokenizer"
    export_tokenizer(tokenizer)
    multi = ["--dataset", "sharegpt", "--tokenizer", str(tokenizer), "--max-input-len", "128",
             "--multi-turn", str(opts.turns), "--output-len", "32", "--ignore-eos", "--cache-bust", "--c", "1",
             "--prompts-per-rung", str(opts.sessions), "--warmup", "1", "--seed", "0"]
    shared = ["--c", "1", "--input-len", "64", "--prefix-len", "512", "--output-len", "4", "--prompts-per-rung", "4",
              "--warmup", "1", "--seed", "0"]
    multi_arms = (Arm("multi-turn-cache-on", serve, multi, opts.bin),
                  Arm("multi-turn-cache-off", f"{serve} {CACHE_OFF}", multi, opts.bin))
    shared_arms = (Arm("shared-prefix-cache-on", serve, shared, opts.bin),
                   Arm("shared-prefix-cache-off", f"{serve} {CACHE_OFF}", shared, opts.bin))
    load_start, start = os.getloadavg()[0], time.time()
    multi_rungs = [run(a, opts.runs)[0] for a in multi_arms]
    shared_rungs = [run(a, opts.runs)[0] for a in shared_arms]
    minutes = (time.time() - start) / 60
    lines = [
        "# Prefix caching: TTFT with cached prefixes, CPU, SmolLM2", "",
        f"Made by `make prefix-cache-report` (benchmarks/prefix_cache_report.py) on {build().describe()}, engine "
        f"of the same tree, {time.strftime('%Y-%m-%d')}, on {cpu_model()} x{os.cpu_count()} (1-minute load average {load_start:.1f} at the "
        f"start, {os.getloadavg()[0]:.1f} at the end, {minutes:.0f} minutes in all; other work on the machine "
        "slows both arms, so the ratios are the figures). Model: the embedded SmolLM2-135M, batch-invariant "
        "numerics, float32, one torch thread; `refengine serve` through HTTP, one server at a time. The H200 "
        "figure (an 8,192-token shared prefix on random qwen3-8b) is in [prefix-cache-h200.md](prefix-cache-h200.md).",
        ""]
    lines += multi_turn_section(*multi_rungs, multi_arms, opts.turns, opts.sessions)
    lines += shared_prefix_section(*shared_rungs, shared_arms)
    opts.out.write_text("\n".join(lines))
    print(f"wrote {opts.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="the H200 shared-prefix report instead of the CPU one")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--bin", type=Path, default=Path(sys.executable).parent,
                        help="folder holding the refengine and ladder commands [default: this Python's]")
    parser.add_argument("--commit", help="the commit whose tree this is, where the checkout's git history is not "
                        "there (a GPU host sent the tree alone) [default: git describe]")
    parser.add_argument("--runs", type=Path, default=Path("runs/prefix-cache"))
    parser.add_argument("--out", type=Path)
    opts = parser.parse_args()
    opts.out = opts.out or Path("reports/prefix-cache-h200.md" if opts.gpu else "reports/prefix-cache.md")
    opts.runs.mkdir(parents=True, exist_ok=True)
    (gpu_main if opts.gpu else cpu_main)(opts)


if __name__ == "__main__":
    main()
