"""reports/prefix-cache.md: TTFT with refengine's prefix cache on and off, on the CPU with the embedded SmolLM2,
through `ladder run` against `refengine serve`. A benchmark, not a test: it writes numbers.

Two workloads, each laddered at c = 1 with the cache on (the default) and off (--no-enable-prefix-caching):
- multi-turn ShareGPT sessions (--multi-turn): each turn resends the conversation so far, so from turn 2 on
  the server can serve the history from its cache; TTFT by turn;
- the shared-prefix workload (--prefix-len): every prompt starts with the same long prefix.

    python benchmarks/prefix_cache_report.py [--turns 5] [--sessions 4] [--out reports/prefix-cache.md]
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

BIN = Path(sys.executable).parent
SERVE = f"{BIN}/refengine serve --model smollm2 --port {{port}} --threads 1 --max-num-seqs 4"
CACHE_OFF = "--no-enable-prefix-caching"


@dataclass(frozen=True)
class Arm:
    label: str
    serve_cmd: str
    args: list[str]

    def command(self, out: Path) -> list[str]:
        return [f"{BIN}/ladder", "run", "--serve-cmd", self.serve_cmd, "--label", self.label, "--out", str(out),
                "--overwrite", *self.args]


def export_tokenizer(folder: Path) -> None:
    """SmolLM2's own tokenizer, from its GGUF, for --tokenizer (ShareGPT turns are counted with it)."""
    from refengine.model.gguf_loader import read_gguf
    from refengine.model.loader import embedded_smollm2_path
    from refengine.tokenizer.tokenizer import Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    Tokenizer.from_gguf_vocab(read_gguf(embedded_smollm2_path()).vocab).save_hf_folder(folder)


def run(arm: Arm, runs: Path) -> dict:
    """Ladder one arm; its only rung's row."""
    out = runs / arm.label
    print(f"== {arm.label}: {shlex.join(arm.command(out))}", flush=True)
    subprocess.run(arm.command(out), check=True)
    (rung,) = json.loads((out / "rungs.json").read_text())
    if rung["status"] != "OK":
        raise SystemExit(f"{arm.label}: rung {rung['status']} ({rung.get('reason')})")
    return rung


def ms(value: float) -> str:
    return f"{value:,.0f}"


def hit_rate(rung: dict) -> str:
    cache = rung.get("prefix_cache")
    if cache is None or cache["hit_rate"] is None:
        return "n/a (the counters stay at 0)" if cache is not None else "n/a"
    return f"{100 * cache['hit_rate']:.0f} % ({cache['hits']:,.0f} of {cache['queries']:,.0f})"


def command_line(arm: Arm) -> str:
    """The arm's command as a reader would type it (paths and the out dir left out)."""
    serve = arm.serve_cmd.replace(f"{BIN}/", "")
    return shlex.join(["ladder", "run", "--serve-cmd", serve, *arm.args])


def multi_turn_section(on: dict, off: dict, arms: tuple[Arm, Arm], turns: int, sessions: int) -> list[str]:
    rows = []
    for t in map(str, range(1, turns + 1)):
        a, b = on["turns"][t], off["turns"][t]
        ratio = a["ttft_ms"]["percentiles"]["p50"] / b["ttft_ms"]["percentiles"]["p50"]
        rows.append(f"| {t} | {a['input_tokens']['mean']:,.0f} | {a['cached_tokens']['mean']:,.0f} | "
                    f"{ms(a['ttft_ms']['percentiles']['p50'])} | {ms(b['ttft_ms']['percentiles']['p50'])} | "
                    f"{ratio:.2f}x |")
    last = str(turns)
    final = (on["turns"][last]["ttft_ms"]["percentiles"]["p50"] / off["turns"][last]["ttft_ms"]["percentiles"]["p50"])
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
    p50 = lambda r: r["stats"]["ttft_ms"]["percentiles"]["p50"]  # noqa: E731
    p90 = lambda r: r["stats"]["ttft_ms"]["percentiles"]["p90"]  # noqa: E731
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--runs", type=Path, default=Path("runs/prefix-cache"))
    parser.add_argument("--out", type=Path, default=Path("reports/prefix-cache.md"))
    opts = parser.parse_args()
    opts.runs.mkdir(parents=True, exist_ok=True)
    tokenizer = opts.runs / "tokenizer"
    export_tokenizer(tokenizer)
    multi = ["--dataset", "sharegpt", "--tokenizer", str(tokenizer), "--max-input-len", "128",
             "--multi-turn", str(opts.turns), "--output-len", "32", "--ignore-eos", "--cache-bust", "--c", "1",
             "--prompts-per-rung", str(opts.sessions), "--warmup", "1", "--seed", "0"]
    shared = ["--c", "1", "--input-len", "64", "--prefix-len", "512", "--output-len", "4", "--prompts-per-rung", "4",
              "--warmup", "1", "--seed", "0"]
    multi_arms = (Arm("multi-turn-cache-on", SERVE, multi), Arm("multi-turn-cache-off", f"{SERVE} {CACHE_OFF}", multi))
    shared_arms = (Arm("shared-prefix-cache-on", SERVE, shared),
                   Arm("shared-prefix-cache-off", f"{SERVE} {CACHE_OFF}", shared))
    load_start, start = os.getloadavg()[0], time.time()
    multi_rungs = [run(a, opts.runs) for a in multi_arms]
    shared_rungs = [run(a, opts.runs) for a in shared_arms]
    minutes = (time.time() - start) / 60
    lines = [
        "# Prefix caching: TTFT with cached prefixes, CPU, SmolLM2", "",
        f"Made by `make prefix-cache-report` (benchmarks/prefix_cache_report.py) on {build().describe()}, engine "
        f"of the same tree, on {cpu_model()} x{os.cpu_count()}: a shared machine that other developers' test "
        f"runs were loading (1-minute load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at "
        f"the end, {minutes:.0f} minutes in all), so absolute times are inflated and noisy; the ratios are the "
        "figures. Model: the embedded SmolLM2-135M, batch-invariant numerics, float32, one torch thread; "
        "`refengine serve` through HTTP, one server at a time.", ""]
    lines += multi_turn_section(*multi_rungs, multi_arms, opts.turns, opts.sessions)
    lines += shared_prefix_section(*shared_rungs, shared_arms)
    lines += ["## Not measured here", "",
              "The H200 figure through HTTP with random qwen3-8b (an 8,192-token shared prefix, a 128-token suffix, "
              "64 output tokens, c = 1 and 8) is not in this report.", ""]
    opts.out.write_text("\n".join(lines))
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
