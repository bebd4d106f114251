"""The ladder: one rung per concurrency, in order. A rung with any failed request is VOID; once the engine
is dead, the rung in flight is VOID(engine_dead) and every later rung NOT_RUN.

Engine death is any of: the --serve-cmd process exited; no chunk from any in-flight request for
--stall-timeout; /health unreachable or 5xx; a 1-token canary completion failing. The last two are checked
between rungs and whenever a request fails.
"""

import asyncio
import os
import platform
import random
import signal
import socket
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from time import perf_counter, time

from ladder import engine_info, prompts
from ladder.audit import AuditProbe
from ladder.client import Progress, request_body, run_phase
from ladder.config import EXIT_ENGINE_DEAD, EXIT_OK, EXIT_VOID, RunConfig, SetupError
from ladder.display import Display
from ladder.endpoint import Endpoint
from ladder.metrics import DEFINITIONS, rung_stats, spec_acceptance
from ladder.records import RequestRecord, failure
from ladder.rung import RungNotRun, RungOk, RungResult, RungVoid, void_from_failures
from ladder.server import ServerProcess, embedded_serve_cmd, free_port
from ladder.store import RunStore

WATCH_INTERVAL_S = 0.1


@dataclass(frozen=True)
class RungWorkload:
    warmup: list[bytes]
    measured: list[bytes]
    prompt_hash: str  # of the measured prompts


@dataclass(frozen=True)
class Workload:
    model: str
    model_info: dict
    server_engine: dict  # engine keys as the server reports them (engine_info.from_server)
    continuous_usage: bool
    sizing: dict
    rungs: dict[int, RungWorkload]


def resolve_target(config: RunConfig) -> tuple[str, str | None]:
    """(base_url, serve_cmd). No --base-url and no --serve-cmd means the embedded `refengine serve`."""
    cmd = config.serve_cmd if config.serve_cmd or config.base_url else embedded_serve_cmd()
    if cmd and "{port}" in cmd:
        if config.base_url:
            raise SetupError("--serve-cmd contains {port}, so the ladder picks the port: drop --base-url")
        port = free_port()
        return f"http://127.0.0.1:{port}", cmd.replace("{port}", str(port))
    if config.base_url is None:
        raise SetupError("--serve-cmd without {port} needs --base-url")
    return config.base_url, cmd


async def prepare(config: RunConfig, ep: Endpoint) -> Workload:
    """Model, server capabilities and every request body, all before any clock starts."""
    models = await ep.models()
    if not models and not config.model:
        raise SetupError("/v1/models lists no model; pass --model")
    model = config.model or models[0]["id"]
    info = next((m for m in models if m.get("id") == model), {})
    server_engine = engine_info.from_server(info, await ep.optional_text("/metrics"),
                                            await ep.optional_json("/props"))

    rng = random.Random(f"ladder-probe:{config.seed}")
    continuous = True

    async def probe(num_words: int):
        nonlocal continuous
        while True:
            body = request_body(prompts.words_text(rng, num_words), model=model, chat=config.chat,
                                max_tokens=1, temperature=config.temperature, continuous_usage=continuous)
            rec = await ep.probe(body, config.timeout_s)
            # NOTE: a server that rejects continuous_usage_stats gets requests without it.
            if continuous and (rec.error or "").startswith("http_error: HTTP 400"):
                continuous = False
                continue
            err = failure(rec, 1, ignore_eos=True, allow_chunk_count=True)
            if err:
                raise SetupError(f"probe request to {ep.base_url + ep.path} failed: {err}")
            if rec.completion_tokens is None and not config.allow_chunk_count:
                raise SetupError("the server sends no usage.completion_tokens; pass --allow-chunk-count "
                                 "to count one token per chunk")
            return rec

    words = (max(16, config.input_len), max(8, config.input_len // 2))
    first = await probe(words[0])
    if config.tokenizer is not None:
        sizer = prompts.tokenizer_sizer(config.tokenizer, config.input_len)
        sizing = {"method": "tokenizer", "tokenizer": str(config.tokenizer)}
    else:
        if first.prompt_tokens is None:
            raise SetupError("the server reports no usage.prompt_tokens, so prompts cannot be sized; "
                             "pass --tokenizer PATH")
        second = await probe(words[1])
        cal = prompts.fit(words, (first.prompt_tokens, second.prompt_tokens))
        num_words = cal.words_for(config.input_len)
        sizer = prompts.calibrated_sizer(num_words)
        sizing = {"method": "probe", "words": num_words, **asdict(cal)}

    def bodies(texts: list[str]) -> list[bytes]:
        return [request_body(t, model=model, chat=config.chat, max_tokens=config.output_len,
                             temperature=config.temperature, continuous_usage=continuous) for t in texts]

    rungs = {}
    for c in config.concurrencies:
        measured = prompts.rung_prompts(config.seed, c, "measured", config.num_prompts(c), sizer)
        warmup = prompts.rung_prompts(config.seed, c, "warmup", config.num_warmup(c), sizer)
        rungs[c] = RungWorkload(bodies(warmup), bodies(measured), prompts.prompt_hash(measured))
    return Workload(model, info, server_engine, continuous, sizing, rungs)


def manifest(config: RunConfig, base_url: str, serve_cmd: str | None, work: Workload, epoch: float) -> dict:
    """Everything `ladder compare` needs to decide whether two runs are like for like."""
    flags = {k: v for k, v in asdict(config).items() if k != "metadata"}
    flags["api_key"] = "<set>" if config.api_key else None
    engine, sources = engine_info.resolve(config.metadata, work.server_engine,
                                          engine_info.from_serve_cmd(serve_cmd))
    hashes = {str(c): w.prompt_hash for c, w in work.rungs.items()}
    return {
        "tool": "ladder", "version": version("specladder"),
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"), "label": config.label,
        "epoch": {"unix_time": time() - (perf_counter() - epoch), "perf_counter": epoch},
        "endpoint": {"base_url": base_url, "backend": config.backend, "serve_cmd": serve_cmd,
                     "path": "/v1/chat/completions" if config.chat else "/v1/completions"},
        "model": work.model, "server_model_info": work.model_info, "engine": engine,
        "engine_sources": sources,
        "workload": {
            "prompt_hash": prompts.prompt_hash(list(hashes.values())), "rung_prompt_hashes": hashes,
            "seed": config.seed, "input_len": config.input_len, "output_len": config.output_len,
            "sampling": {"temperature": config.temperature, "ignore_eos": True, "max_tokens": config.output_len},
            "endpoint_kind": config.backend, "prompt_sizing": work.sizing,
            "continuous_usage_stats": work.continuous_usage,
            "output_count": "usage, else chunks" if config.allow_chunk_count else "usage"},
        "flags": flags, "metadata": config.metadata,
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(),
                 "python": sys.version.split()[0], "cpu_count": os.cpu_count()},
        "definitions": DEFINITIONS,
    }


class Ladder:
    def __init__(self, config: RunConfig, ep: Endpoint, server: ServerProcess | None, work: Workload,
                 store: RunStore, display: Display, epoch: float):
        self.config, self.ep, self.server, self.work = config, ep, server, work
        self.store, self.display, self.epoch = store, display, epoch

    def _failure(self, rec: RequestRecord) -> str | None:
        return failure(rec, self.config.output_len, ignore_eos=True, allow_chunk_count=self.config.allow_chunk_count)

    def _server_exited(self) -> str | None:
        if self.server is not None and (rc := self.server.exit_code()) is not None:
            return f"the server process exited with code {rc}"
        return None

    def _dead_now(self, progress: Progress) -> str | None:
        """The checks cheap enough to run every WATCH_INTERVAL_S: process liveness and stall."""
        idle = perf_counter() - progress.last_activity
        if progress.in_flight and idle > self.config.stall_timeout_s:
            return f"stall: no chunk for {idle:.0f} s with {progress.in_flight} requests in flight"
        return self._server_exited()

    async def check_alive(self) -> str | None:
        return self._server_exited() or await self.ep.check_alive(self.work.model, self.config.stall_timeout_s)

    async def _watch(self, task: asyncio.Task, progress: Progress) -> str | None:
        """Wait for the phase; on engine death cancel it and return why."""
        probe: asyncio.Task | None = None
        probed = 0
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=WATCH_INTERVAL_S)
                dead = self._dead_now(progress)
                if probe is not None and probe.done():
                    dead, probe = dead or probe.result(), None
                if dead:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    return dead
                if probe is None and progress.num_failed > probed:
                    probed = progress.num_failed
                    probe = asyncio.create_task(self.check_alive())
            task.result()  # a bug in the client surfaces here rather than as a silent VOID
            return None
        finally:
            if probe is not None:
                probe.cancel()

    async def _phase(self, c: int, phase: str, bodies: list[bytes]) -> tuple[list[RequestRecord], str | None]:
        records = [RequestRecord(c, phase, i) for i in range(len(bodies))]
        progress = Progress(perf_counter())

        def on_done(rec: RequestRecord) -> bool:
            failed = self._failure(rec) is not None
            self.display.request_done(progress.num_failed + failed)
            return failed

        self.display.phase_start(c, phase, len(bodies))
        task = asyncio.create_task(run_phase(self.ep.target, bodies, records, c, progress,
                                             self.config.timeout_s, on_done))
        try:
            dead = await self._watch(task, progress)
        finally:
            self.display.phase_end()
        if dead:
            for rec in records:
                if not rec.done and rec.error is None:
                    rec.error = f"engine_dead: {dead}"
        return records, dead

    async def run_rung(self, c: int) -> tuple[RungResult, list[RequestRecord], str | None]:
        work = self.work.rungs[c]
        records, dead = await self._phase(c, "warmup", work.warmup)
        measured: list[RequestRecord] = [RequestRecord(c, "measured", i) for i in range(len(work.measured))]
        if dead is None:
            before = await self.ep.counters()
            audit_probe = AuditProbe(self.config.audit)
            measured, dead = await self._phase(c, "measured", work.measured)
            audit = audit_probe.stop(measured)
            spec = spec_acceptance(before, await self.ep.counters())
        records += measured
        failures = [f for r in records if (f := self._failure(r)) is not None]
        if failures and dead is None:
            dead = await self.check_alive()
        if failures or dead:
            return void_from_failures(c, len(records) - len(failures), failures, work.prompt_hash, dead), \
                records, dead
        stats = rung_stats(measured, self.config.percentiles)
        return RungOk(c, len(records), work.prompt_hash, stats, audit, spec), records, None

    async def run(self) -> tuple[list[RungResult], str | None]:
        rungs: list[RungResult] = []
        dead = None
        for i, c in enumerate(self.config.concurrencies):
            if dead is None and i > 0:
                dead = await self.check_alive()
            if dead is not None:
                rungs.append(RungNotRun(c, f"engine_dead: {dead}"))
            else:
                rung, records, dead = await self.run_rung(c)
                rungs.append(rung)
                self.store.append_records(records, self.epoch)
            self.store.write_rungs(rungs)
            self.display.rung_end(rungs[-1])
        return rungs, dead


def exit_code(rungs: list[RungResult], dead: str | None) -> int:
    if dead is not None:
        return EXIT_ENGINE_DEAD
    return EXIT_VOID if any(isinstance(r, RungVoid) for r in rungs) else EXIT_OK


def default_out_dir(label: str) -> Path:
    return Path("runs") / f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{label}"


async def _run(config: RunConfig, store: RunStore, display: Display) -> int:
    epoch = perf_counter()
    base_url, serve_cmd = resolve_target(config)
    server = None
    try:
        async with Endpoint(base_url, config.api_key, config.chat) as ep:
            if serve_cmd:
                display.note(f"starting: {serve_cmd}")
                server = ServerProcess(serve_cmd, store.path("server.log"))
                await server.wait_ready(ep, config.serve_timeout_s)
            work = await prepare(config, ep)
            info = manifest(config, base_url, serve_cmd, work, epoch)
            store.write_manifest(info)
            display.note(f"ladder {base_url} model={work.model} c={','.join(map(str, config.concurrencies))} "
                         f"in={config.input_len} out={config.output_len} -> {store.dir}")
            rungs, dead = await Ladder(config, ep, server, work, store, display, epoch).run()
            code = exit_code(rungs, dead)
            info["result"] = {"exit_code": code, "engine_dead": dead}
            store.write_manifest(info)
            display.definitions()
            return code
    finally:
        if server is not None:
            server.stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through _run's finally, which stops a server the ladder started


def run_ladder(config: RunConfig, display: Display) -> int:
    store = RunStore(config.out_dir or default_out_dir(config.label))
    # NOTE: SIGTERM, and SIGINT too where a non-interactive shell started the ladder in the background
    # (it is then ignored), would otherwise end the ladder and leave its --serve-cmd server running.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return asyncio.run(_run(config, store, display))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
