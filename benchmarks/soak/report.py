"""reports/soak.md: the command, the machine, the checks, the plots and a table of every sample."""

import os
import platform
import shlex
import subprocess
import time
from pathlib import Path

import psutil

from .config import SoakConfig
from .observe import fmt_ms, percentile

REPO = Path(__file__).resolve().parents[2]


def plots(samples: list[dict], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    t = [s["t"] / 60 for s in samples]
    figures = {
        "rss.png": ("server RSS (MiB)", [("RSS", [s["rss_mib"] for s in samples])]),
        "blocks.png": ("KV blocks in use / requests", [
            ("KV blocks in use", [s["kv_blocks_in_use"] for s in samples]),
            ("requests in flight", [s["requests_in_flight"] for s in samples]),
        ]),
        "p99.png": ("milliseconds (per sample window)", [
            ("p99 TPOT", [(s["tpot_p99"] or float("nan")) * 1000 for s in samples]),
            ("p50 TPOT", [(s["tpot_p50"] or float("nan")) * 1000 for s in samples]),
            ("p99 TTFT / 10", [(s["ttft_p99"] or float("nan")) * 100 for s in samples]),
        ]),
    }  # fmt: skip
    paths = []
    for name, (ylabel, series) in figures.items():
        fig, ax = plt.subplots(figsize=(7, 3))
        for label, ys in series:
            ax.plot(t, ys, marker=".", label=label)
        ax.set_xlabel("minutes")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        fig.savefig(folder / name, dpi=90)
        plt.close(fig)
        paths.append(folder / name)
    return paths


def context() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=REPO).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if "model name" in line), platform.processor())  # fmt: skip
    return (
        f"- machine: {cpu}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
        f"{platform.system()} {platform.release()}; load average at the start {os.getloadavg()[0]:.1f}\n"
        f"- commit {commit.strip()}{' (with local changes)' if dirty.strip() else ''}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
    )


def report(config: SoakConfig, command: str, ctx: str, result: dict, plot_paths: list[Path], out: Path) -> str:
    ok = all(v["ok"] for v in result["verdicts"])
    rows = "\n".join(f"| {v['check']} | {'ok' if v['ok'] else '**FAILED**'} | {v['detail']} |" for v in result["verdicts"])
    samples = "\n".join(
        f"| {s['t']:.0f} | {s['rss_mib']:.0f} | {s['kv_blocks_in_use']:.0f} | {s['requests_in_flight']:.0f} "
        f"| {s['requests_running']:.0f} / {s['requests_waiting']:.0f} | {fmt_ms(s['ttft_p50'])} / {fmt_ms(s['ttft_p99'])} "
        f"| {fmt_ms(s['tpot_p50'])} / {fmt_ms(s['tpot_p99'])} | {sum(s['client']['completed'].values())} "
        f"| {s['client']['aborted_by_client']} | {sum(s['client']['malformed'].values())} | {s['client']['refused_429']} "
        f"| {sum(s['client']['server_errors'].values())} |"
        for s in result["samples"]
    )
    images = "\n".join(f"![{p.stem}]({p.relative_to(out.parent)})" for p in plot_paths)
    loaded = [t["tpot"] for t in result["timings"] if t["tpot"] is not None]
    return f"""# Soak: `refengine serve` under a long mixed load

Written by `make soak` (`python -m benchmarks.soak`, in `benchmarks/soak/`). Verdict: **{'PASSED' if ok else 'FAILED'}**
({'counts only; no RSS or TPOT thresholds' if config.counts_only else 'all checks, RSS and TPOT thresholds included'}).

```
{command}
```

{ctx}- server: `{shlex.join(result['serve_command'])}`
- load: {config.concurrency} client loops ({config.num_slow_clients} reading slowly, 50 ms per event) for
  {config.duration_s:.0f} s; lengths from seeded lognormals shaped like ShareGPT's, scaled down 4x for a CPU
  (prompt median ~25 words, output median ~50 tokens, capped at 256); {config.abort_fraction:.0%} of streams (evenly spread) closed
  by the client at a random point; {config.malformed_fraction:.0%} malformed requests (evenly spread); every {config.burst_every_s:.0f} s
  a burst of {config.capacity + config.concurrency} short requests against a capacity of {config.capacity}
  (--max-num-seqs {config.max_num_seqs} + --max-waiting-requests {config.max_waiting_requests}).

## Checks

| check | result | detail |
|---|---|---|
{rows}

## Latency under load against the unloaded figure

TPOT of one request alone on the server (median of 3, 64 tokens): {fmt_ms(result['unloaded_tpot'])}.
TPOT of the accepted requests under load (c={config.concurrency} plus bursts): p50 {fmt_ms(percentile(loaded, 0.5))},
p99 {fmt_ms(percentile(loaded, 0.99))}, over {len(loaded)} requests. A figure, not a test.

## Over time

{images}

| t (s) | RSS (MiB) | KV blocks in use | in flight | running / waiting | TTFT p50 / p99 | TPOT p50 / p99 | finished | closed by client | malformed | 429 | 5xx |
|---|---|---|---|---|---|---|---|---|---|---|---|
{samples}

Percentiles are over the requests that finished in each sample's window. The last row is taken after
the load stopped and the server went idle. Every sample's /metrics and client counts are in the JSON
(`--json`).
"""
