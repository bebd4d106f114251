"""Soak: `refengine serve` under a long, mixed, hostile load, checked for leaks and drift.

    python -m benchmarks.soak [--model smollm2] [--speculative-config JSON] [--concurrency 32]
                              [--duration 1800] [--out reports/soak.md] [--json soak.json] [--counts-only]

It starts `refengine serve` on a free loopback port and runs `--concurrency` client loops against it:
prompt and output lengths drawn (seeded) from lognormals shaped like ShareGPT's, scaled to a CPU; every
tenth stream closed by the client at a random point; every twentieth request malformed; a few clients that read
their stream slowly; and, every `--burst-every` seconds, a burst of short requests past the server's
queue bound (--max-waiting-requests), which must be refused with 429. Every `--sample-every` seconds it
records the server's RSS, KV blocks in use against requests in flight, the /metrics counters, p50/p99
TTFT and TPOT, and errors by kind.

It fails (exit 1) on any 5xx; a KV block still in use after the load stops; /metrics counters that
disagree with the client's; a variant of the mix that never happened; and, unless --counts-only,
RSS growing by more than 10% after the first window (5 minutes) or p99 TPOT of the last window more
than 20% above the first. A benchmark, not a test: the CI runs a 60-second --counts-only slice.
"""

import argparse
import asyncio
import contextlib
import json
import random
import shlex
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import httpx

from .config import SoakConfig
from .load import WORDS, Load, Recorder
from .observe import Sampler, scrape, settle
from .report import context, plots, report
from .verdicts import verdicts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(config: SoakConfig, port: int) -> list[str]:
    refengine = str(Path(sys.executable).with_name("refengine"))
    cmd = [
        refengine, "serve", "--model", config.model, "--port", str(port), "--log-level", "warning",
        "--max-num-seqs", str(config.max_num_seqs), "--max-model-len", str(config.max_model_len),
        "--max-waiting-requests", str(config.max_waiting_requests),
    ]  # fmt: skip
    if config.speculative_config:
        cmd += ["--speculative-config", config.speculative_config]
    if config.threads:
        cmd += ["--threads", str(config.threads)]
    return cmd


async def unloaded_tpot(url: str, rng: random.Random) -> float | None:
    """TPOT of one request alone on the server, three times: the figure loaded TPOT is set against."""
    recorder = Recorder()
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for _ in range(3):
            body = {"prompt": " ".join(rng.choice(WORDS) for _ in range(24)), "max_tokens": 64, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
            await recorder.stream(client, "/v1/completions", body, abort_after=None, read_delay=0)
    tpots = [t.tpot for t in recorder.timings if t.tpot is not None]
    return statistics.median(tpots) if tpots else None


async def soak(load: Load, sampler: Sampler) -> None:
    sampling = asyncio.create_task(sampler.loop(load))
    await load.run()
    sampling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling


def parse_args(argv: list[str] | None) -> tuple[SoakConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--speculative-config", default='{"method": "eagle", "num_speculative_tokens": 3}')
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=1800, help="seconds of load")
    p.add_argument("--sample-every", type=float, default=30)
    p.add_argument("--window", type=float, default=300, help="seconds: first/last windows for RSS and TPOT")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-waiting-requests", type=int, default=24)
    p.add_argument("--burst-every", type=float, default=120)
    p.add_argument("--abort-fraction", type=float, default=0.10)
    p.add_argument("--malformed-fraction", type=float, default=0.05)
    p.add_argument("--slow-clients", type=int, default=2)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--threads", type=int, default=None, help="the server's torch threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--counts-only", action="store_true", help="skip the RSS and TPOT thresholds (short runs)")
    p.add_argument("--out", type=Path, default=None, help="the markdown report (plots go next to it)")
    p.add_argument("--json", type=Path, default=None, help="every sample, timing and verdict")
    a = p.parse_args(argv)
    config = SoakConfig(
        model=a.model, speculative_config=a.speculative_config or None, concurrency=a.concurrency,
        duration_s=a.duration, sample_every_s=a.sample_every, window_s=a.window, max_num_seqs=a.max_num_seqs,
        max_waiting_requests=a.max_waiting_requests, burst_every_s=a.burst_every, abort_fraction=a.abort_fraction,
        malformed_fraction=a.malformed_fraction, num_slow_clients=min(a.slow_clients, a.concurrency),
        max_model_len=a.max_model_len, threads=a.threads, seed=a.seed, counts_only=a.counts_only,
    )  # fmt: skip
    return config, a


def main(argv: list[str] | None = None) -> int:
    config, args = parse_args(argv)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = serve_command(config, port)
    ctx = context()
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                print(f"the server exited early:\n{server.stderr.read()}", file=sys.stderr)
                return 2
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                print("the server did not start in 600 s", file=sys.stderr)
                return 2
            time.sleep(0.2)
        rng = random.Random(config.seed + 1)
        unloaded = asyncio.run(unloaded_tpot(url, rng))
        # The counters start from here: the unloaded requests are not part of the tally.
        base = scrape(url)
        load = Load(config, url)
        sampler = Sampler(url, server.pid, config.sample_every_s)
        asyncio.run(soak(load, sampler))
        final_raw = settle(url)
        # Counters relative to the start of the load (the unloaded probe came first).
        final = {k: v - base.get(k, 0) if k.endswith("_total") or "_total[" in k else v for k, v in final_raw.items()}
        sampler.take(load, since=sampler.samples[-1]["t"] if sampler.samples else 0.0)
        result = {
            "config": asdict(config),
            "serve_command": cmd,
            "unloaded_tpot": unloaded,
            "verdicts": verdicts(config, load.tally, final, sampler.samples, load.recorder.timings),
            "tally": load.tally.snapshot(),
            "final_metrics": final,
            "samples": sampler.samples,
            "timings": [asdict(t) for t in load.recorder.timings],
        }
    finally:
        server.terminate()
        try:
            _, stderr = server.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            _, stderr = server.communicate()
    result["server_exit"] = server.returncode
    result["verdicts"].append(
        {"check": "the server drains and exits 0 on SIGTERM", "ok": server.returncode == 0,
         "detail": f"exit {server.returncode}" + ("" if server.returncode == 0 else f": {stderr[-2000:]}")}
    )  # fmt: skip
    for v in result["verdicts"]:
        print(f"{'ok    ' if v['ok'] else 'FAILED'} {v['check']}: {v['detail']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    if args.out:
        command = "python -m benchmarks.soak " + shlex.join(argv if argv is not None else sys.argv[1:])
        paths = plots(result["samples"], args.out.parent / args.out.stem)
        args.out.write_text(report(config, command, ctx, result, paths, args.out))
    return 0 if all(v["ok"] for v in result["verdicts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
