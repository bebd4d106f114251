"""The ladder: one rung per concurrency (closed loop) or per request rate (open loop), in order. A rung with
any failed request is VOID; once the engine is dead, the rung in flight is VOID(engine_dead) and every later
rung NOT_RUN.

Engine death is any of: the --serve-cmd process exited; a stall (no chunk from any in-flight request for
--stall-timeout, longer while long prompts await their first chunk) with /health failing or no /metrics work
counter moving; /health unreachable or 5xx; 2 of 3 1-token canary completions failing. The last two are
checked between rungs and whenever a request fails. A server whose /health says it is shutting down is
reported as such, not as dead.

A rung's warmup always runs closed loop (at c, or at --max-concurrency in open loop): it only has to warm
the engine; the measured phase follows the rung's load.

SIGINT or SIGTERM cancels the command at its next await: the rung in flight keeps every request it sent in
requests.jsonl (those cut off as failed "interrupted"), its finished measured requests make it a PARTIAL
rung, the manifest says so, and a server the ladder started is stopped.
"""

import asyncio
import hashlib
import json
import math
import signal
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from time import perf_counter, time

from ladder import (
    arrivals,
    content_types,
    engine_info,
    gpu,
    host,
    load_check,
    repeats,
    rfc_json,
    scrape,
    spec_metrics,
)
from ladder.audit import Audit, AuditProbe
from ladder.client import Progress, run_open_loop, run_phase, run_sessions
from ladder.config import (
    DEFAULT_INPUT_LEN,
    DEFAULT_OUTPUT_LEN,
    EXIT_ENGINE_DEAD,
    EXIT_OK,
    EXIT_VOID,
    FIRST_LOOK,
    RunConfig,
    SetupError,
)
from ladder.display import Display, load_label
from ladder.endpoint import Endpoint
from ladder.metrics import DEFINITIONS, rung_stats, spec_acceptance, turn_stats
from ladder.multiturn import SessionPhase
from ladder.own_version import build, own_version
from ladder.prefix_cache import prefix_cache_hits
from ladder.records import RequestRecord, failure
from ladder.redact import redact_cmd, redact_url
from ladder.rung import (
    SHUTTING_DOWN,
    RungNotRun,
    RungOk,
    RungResult,
    RungVoid,
    gone_reason,
    void_from_failures,
)
from ladder.server import ServerProcess, embedded_serve_cmd, free_port
from ladder.store import RunStore
from ladder.workload import Builder, Request, Workload, prepare, with_nonce

WATCH_INTERVAL_S = 0.1
# While requests wait for their first chunk, the stall limit is --stall-timeout per this many request bytes
# waiting (about 700 tokens of English prompt), never less than one --stall-timeout: prefill takes longer
# the more prompt there is, and no chunk flows meanwhile.
FIRST_CHUNK_BYTES = 4096
INPUT_LEN_TOLERANCE = 0.05  # realised prompt_tokens further than this from --input-len get a warning
# The embedded SmolLM2's decode rate on a CPU, at best (2 cores, c = 16: reports/cpu-bench.md): what a bare
# `ladder run`'s estimate divides its output tokens by. Lower c decode slower still.
EMBEDDED_CPU_TOK_S = 50


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


def redacted_flags(config: RunConfig) -> dict:
    """The flags as recorded: secrets (the API key, header values, keys and tokens in --serve-cmd) never
    reach a file."""
    flags = {k: v for k, v in asdict(config).items() if k != "metadata"}
    flags["api_key"] = "<set>" if config.api_key else None
    flags["headers"] = {k: "<set>" for k in config.headers}
    flags["serve_cmd"] = redact_cmd(config.serve_cmd)
    flags["base_url"] = redact_url(config.base_url)
    return flags


def manifest(config: RunConfig, base_url: str, serve_cmd: str | None, work: Workload, epoch: float) -> dict:
    """Everything `ladder compare` needs to decide whether two runs are like for like."""
    engine, sources = engine_info.resolve(config.metadata, work.server_engine,
                                          engine_info.from_serve_cmd(serve_cmd))
    hashes = {str(load): w.prompt_hash for load, w in work.rungs.items()}
    bust = ({"per_session": True} if config.multi_turn and config.busts_cache
            else {"nonce": work.nonce} if work.nonce else False)
    return {
        "tool": "ladder", "version": own_version(),
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"), "label": config.label,
        "epoch": {"unix_time": time() - (perf_counter() - epoch), "perf_counter": epoch},
        "endpoint": {"base_url": redact_url(base_url), "backend": config.backend, "serve_cmd": redact_cmd(serve_cmd),
                     "path": "/v1/chat/completions" if config.chat else "/v1/completions"},
        "model": work.model, "server_model_info": work.model_info, "engine": engine,
        "engine_sources": sources,
        "workload": {
            "prompt_hash": hashlib.sha256("\0".join(hashes.values()).encode()).hexdigest(),
            "rung_prompt_hashes": hashes, "dataset": work.dataset,
            "seed": config.seed, "input_len": config.input_len if work.dataset["kind"] == "random" else None,
            "output_len": config.output_len,
            "sampling": {"temperature": config.temperature, "ignore_eos": config.eos_ignored,
                         "max_tokens": config.output_len, **config.body_extra,
                         **({} if config.stream else {"stream": False})},
            "length_dist": ({"kind": config.length_dist, "range_ratio": config.range_ratio}
                            if config.range_ratio else None),
            "load": ({"request_rate": list(config.request_rates), "burstiness": config.burstiness,
                      "max_concurrency": config.max_concurrency} if config.open_loop
                     else {"concurrency": list(config.concurrencies)}),
            "multi_turn": ({"turns": config.multi_turn, "reply": config.multi_turn_reply}
                           if config.multi_turn else None),
            "trace": _trace_info(config, work),
            "max_duration_s": config.max_duration_s,
            "cache_bust": bust,
            "endpoint_kind": config.backend, "prompt_sizing": work.sizing,
            "continuous_usage_requested": work.continuous_usage,
            "continuous_usage_stats": None,  # what the server sent; set once requests came back
            "output_count": "usage, else chunks" if config.allow_chunk_count else "usage"},
        "flags": redacted_flags(config), "metadata": config.metadata,
        "code": asdict(build()), "host": host.describe(),
        "definitions": DEFINITIONS,
    }


def _trace_info(config: RunConfig, work: Workload) -> dict | None:
    """A trace's replay as the guard compares it: its schedule (due times, by hash) and speedup."""
    if config.dataset_kind != "trace":
        return None
    (rung,) = work.rungs.values()
    return {"num_requests": len(rung.due), "speedup": config.trace_speedup, "span_s": rung.due[-1],
            "schedule_hash": hashlib.sha256(json.dumps(rung.due).encode()).hexdigest()}


class Ladder:
    def __init__(self, config: RunConfig, ep: Endpoint, server: ServerProcess | None, work: Workload,
                 store: RunStore, display: Display, epoch: float, spec_method: str | None = None):
        self.config, self.ep, self.server, self.work = config, ep, server, work
        self.spec_method = spec_method  # the engine key: "none" (or unknown) makes tok/chunk > 1 worth a word
        self.store, self.display, self.epoch = store, display, epoch
        self.builder = Builder(config, work.model, work.continuous_usage, work.nonce)  # --multi-turn's turn bodies
        self.usage_seen = False  # did any chunk carry continuous usage?
        self._counters: dict[str, float] = {}  # /metrics counters at the last look (stall checks)
        self.warnings: list[str] = []
        self.in_flight: list[list[RequestRecord]] = []  # the phases of the rung in flight: what an interrupt keeps
        self.probe: AuditProbe | None = None  # its measured phase's client audit
        self.partial: list[str] = []  # the rungs an interrupt cut short, by label
        # NOTE: GPU readings only for a server on this host; a remote server's GPUs are not ours.
        self.gpu = gpu.sampler() if server is not None and config.metrics_interval_s else None

    def _failure(self, rec: RequestRecord) -> str | None:
        return failure(rec, rec.max_tokens, ignore_eos=self.config.eos_ignored,
                       allow_chunk_count=self.config.allow_chunk_count)

    def _server_exited(self) -> str | None:
        if self.server is not None and (rc := self.server.exit_code()) is not None:
            return f"the server process exited with code {rc}"
        return None

    def _stall(self, progress: Progress) -> str | None:
        """A stall suspected: no chunk for longer than the stall limit, which grows with the prompt bytes
        still waiting for their first chunk (FIRST_CHUNK_BYTES)."""
        idle = perf_counter() - progress.last_activity
        limit = self.config.stall_timeout_s * max(1.0, progress.waiting_bytes / FIRST_CHUNK_BYTES)
        if progress.in_flight and idle > limit:
            return f"stall: no chunk for {idle:.0f} s with {progress.in_flight} requests in flight"
        return None

    async def _confirm_stall(self, stall: str, progress: Progress) -> str | None:
        """A silent engine is dead only when it makes no progress: /health must answer and some /metrics
        counter must have moved since the last look. Progress restarts the stall clock."""
        if (health := await self.ep.health()) is not None:
            return health if health.startswith(SHUTTING_DOWN) else f"{stall}; {health}"
        counters = await self.ep.progress_counters()
        if counters and counters != self._counters:
            self._counters = counters
            progress.last_activity = perf_counter()
            return None
        return f"{stall}; /metrics shows no progress" if counters else stall

    async def check_alive(self) -> str | None:
        return self._server_exited() or await self.ep.check_alive(self.work.model, self.config.stall_timeout_s)

    async def _watch(self, task: asyncio.Task, progress: Progress) -> str | None:
        """Wait for the phase; on engine death cancel it and return why."""
        probe: asyncio.Task | None = None
        probed = 0
        self._counters = await self.ep.progress_counters()
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=WATCH_INTERVAL_S)
                dead = self._server_exited()
                if probe is not None and probe.done():
                    dead, probe = dead or probe.result(), None
                if dead:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    return dead
                if probe is None and progress.num_failed > probed:
                    probed = progress.num_failed
                    probe = asyncio.create_task(self.check_alive())
                elif probe is None and (stall := self._stall(progress)) is not None:
                    probe = asyncio.create_task(self._confirm_stall(stall, progress))
            task.result()  # a bug in the client surfaces here rather than as a silent VOID
            return None
        finally:
            if probe is not None:
                probe.cancel()

    def _record(self, load: int | float, phase: str, index: int, req: Request, repeat: int) -> RequestRecord:
        """A record that says how it was sent: under which in-flight cap (an open-loop measured request
        has --max-concurrency or none; its warmup runs closed loop at concurrency_of), at which rate, in
        which --repeats run, streamed or not, and which turn of which session it is."""
        cfg = self.config
        open_measured = cfg.open_loop and phase == "measured"
        cap = cfg.max_concurrency if open_measured else cfg.concurrency_of(load)
        return RequestRecord(cap, phase, index, max_tokens=req.max_tokens, request_rate=load if cfg.open_loop else None,
                             repeat=repeat, streamed=cfg.stream, session=req.session, turn=req.turn,
                             content_type=req.content_type)

    def _launch(self, load: int | float, phase: str, requests: list[Request], bodies: list[bytes],
                records: list[RequestRecord], progress: Progress, on_done) -> asyncio.Task:
        cfg = self.config
        # NOTE: --max-duration bounds the measured phase only: an unsent warmup request would read as failed.
        stop_after_s = cfg.max_duration_s if phase == "measured" else None
        if cfg.multi_turn:
            sessions = SessionPhase(requests, records, self.builder, cfg.multi_turn_reply == "server",
                                    cfg.busts_cache, cfg.save_text)
            return asyncio.create_task(run_sessions(self.ep.target, sessions.records, sessions.body,
                                                    cfg.concurrency_of(load), progress, cfg.timeout_s, on_done,
                                                    stop_after_s))
        if cfg.open_loop and phase == "measured":
            due = self.work.rungs[load].due or arrivals.due_times(len(bodies), load, cfg.burstiness,
                                                                  seed=hash_seed(cfg.seed, load))
            return asyncio.create_task(run_open_loop(self.ep.target, bodies, records, due, cfg.max_concurrency,
                                                     progress, cfg.timeout_s, on_done, cfg.max_duration_s))
        return asyncio.create_task(run_phase(self.ep.target, bodies, records, cfg.concurrency_of(load), progress,
                                             cfg.timeout_s, on_done, stop_after_s))

    async def _phase(self, load: int | float, phase: str, requests: list[Request], bodies: list[bytes],
                     repeat: int = 0) -> tuple[list[RequestRecord], str | None, Progress, scrape.Series | None]:
        """Run one phase; its /metrics series (tick 0 before its first request, the closing sample after
        its last) goes to metrics.jsonl under the phase's rung, repeat and name."""
        c = self.config.concurrency_of(load)
        records = [self._record(load, phase, i, r, repeat) for i, r in enumerate(requests)]
        if self.config.save_text and not self.config.multi_turn:  # a turn's prompt is saved as it is sent
            for rec, req in zip(records, requests):
                rec.prompt, rec.output_text = list(with_nonce(req.messages, self.work.nonce)), ""
        progress = Progress(perf_counter())
        self.in_flight.append(records)

        def on_done(rec: RequestRecord) -> bool:
            failed = self._failure(rec) is not None
            self.usage_seen = self.usage_seen or bool(rec.chunk_usage)
            self.display.request_done(rec, failed)
            return failed

        self.display.phase_start(f"rate={load:g}" if self.config.open_loop else f"c={load}", phase, len(requests))
        scraper = await self._start_scraper()
        task = self._launch(load, phase, requests, bodies, records, progress, on_done)
        try:
            dead = await self._watch(task, progress)
        except BaseException:  # interrupted: the requests in flight stop here, and the rung keeps the rest
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        finally:
            self.display.phase_end()
        series = None
        if scraper is not None:
            series = await scraper.stop()
            rate = load if self.config.open_loop else None
            self.store.append_metrics(series, {"concurrency": c, "request_rate": rate, "repeat": repeat,
                                               "phase": phase}, self.epoch)
        if dead:
            for rec in records:
                if not rec.done and rec.error is None:
                    rec.error = gone_reason(dead)  # never sent, or cut off: failed either way
        return records, dead, progress, series

    async def _start_scraper(self) -> scrape.Scraper | None:
        if not self.config.metrics_interval_s:
            return None
        scraper = scrape.Scraper(lambda: self.ep.optional_text("/metrics"), self.config.metrics_interval_s, self.gpu)
        await scraper.start()
        return scraper

    async def run_rung(self, load: int | float, repeat: int = 0) -> tuple[RungResult, list[RequestRecord], str | None]:
        cfg, work = self.config, self.work.rungs[load]
        c = cfg.concurrency_of(load)
        rate = load if cfg.open_loop else None
        records, dead, _, _ = await self._phase(load, "warmup", work.warmup, work.warmup_bodies, repeat)
        measured = [self._record(load, "measured", i, r, repeat) for i, r in enumerate(work.measured)]
        progress = Progress(0.0)
        server_metrics = None
        if dead is None:
            before = await self.ep.counters()
            self.probe = AuditProbe(cfg.audit)
            measured, dead, progress, series = await self._phase(load, "measured", work.measured,
                                                                 work.measured_bodies, repeat)
            # NOTE: the rung's server metrics are its measured phase's, as its other numbers are
            sent = [r for r in measured if r.t_send]
            window = (min(r.t_send for r in sent), max(r.t_end for r in sent)) if sent else None
            server_metrics = scrape.summary(series, window) if series is not None and window else None
            audit = self.probe.stop(measured)
            after = await self.ep.counters()
            spec, cache = spec_acceptance(before, after), prefix_cache_hits(before, after)
        # NOTE: with --max-duration, requests the clock cut off were never sent: not part of the rung.
        sent = [r for r in measured if r.t_send or r.error is not None]
        num_unsent = len(measured) - len(sent)
        measured = sent
        records += measured
        failures = [f for r in records if (f := self._failure(r)) is not None]
        phases = [r.phase for r in records if self._failure(r) is not None]
        if failures and dead is None:
            dead = await self.check_alive()
        if failures or dead:
            return void_from_failures(c, len(records) - len(failures), failures, work.prompt_hash, dead,
                                      request_rate=rate, phases=phases), records, dead
        stats = rung_stats(measured, cfg.percentiles, cfg.goodput)
        # NOTE: at inf every request is due at t = 0: no schedule to fall behind (a --max-concurrency wait is
        # the cap's, as in vLLM)
        late = (arrivals.lateness([r.t_due for r in measured], [r.t_send for r in measured])
                if cfg.open_loop and math.isfinite(load) else None)
        turns = turn_stats(measured, cfg.percentiles) if cfg.multi_turn else None
        sends = [r.t_send for r in measured]
        delivered = (load_check.open_loop(load, cfg.burstiness, sends) if cfg.open_loop
                     else load_check.closed_loop(c, sends, [r.t_end for r in measured]))
        return RungOk(c, len(records), work.prompt_hash, stats, audit, spec, request_rate=rate,
                      num_measured=len(measured), num_unsent=num_unsent, peak_in_flight=progress.peak_in_flight,
                      lateness=late, prefix_cache=cache, server_metrics=server_metrics, turns=turns,
                      spec_requests=spec_metrics.distribution([r.spec for r in measured]),
                      by_content=content_types.by_content(measured, cfg.percentiles),
                      delivered_load=delivered), records, None

    async def run(self) -> tuple[list[RungResult], str | None]:
        rungs: list[RungResult] = []
        dead = None
        for i, load in enumerate(self.config.loads):
            rate = load if self.config.open_loop else None
            c = self.config.concurrency_of(load)
            if dead is None and i > 0:
                dead = await self.check_alive()
            if dead is not None:
                rungs.append(RungNotRun(c, gone_reason(dead), request_rate=rate))
            else:
                try:
                    rung, dead = await self.run_repeats(load)
                except (asyncio.CancelledError, KeyboardInterrupt):
                    if self.in_flight:
                        rungs.append(self._keep_interrupted(load))
                        self.store.write_rungs(rungs)
                    raise
                rungs.append(rung)
            self.store.write_rungs(rungs)
            self.display.rung_end(rungs[-1])
            for warning in (self._input_len_warning(rungs[-1]), self._chunk_warning(rungs[-1])):
                if warning is not None:
                    self.warnings.append(warning)
                    self.display.note(f"warning: {warning}")
        return rungs, dead

    def _chunk_warning(self, rung: RungResult) -> str | None:
        """Without speculation every chunk carries one token, unless tokens without text (special ones, which
        random weights sample) were counted in usage but sent in no chunk of their own: say so, so that a
        tok/chunk above 1 is not read as accepted drafts."""
        if (not isinstance(rung, RungOk) or rung.spec is not None or self.spec_method not in (None, "none")
                or rung.stats.tokens_per_chunk is None):  # --no-stream: no chunks to count
            return None
        per_chunk = rung.stats.tokens_per_chunk.mean
        if per_chunk <= 1:
            return None
        return (f"{load_label(rung)}: {per_chunk:.2f} tokens per chunk with no speculation reported: tokens without "
                f"text (special tokens, as random weights sample) count in usage but come in no chunk of their own "
                f"(or the server batches its chunks); it is not an acceptance")

    def _keep_interrupted(self, load: int | float) -> RungResult:
        """The rung an interrupt cut short: every request it sent goes to requests.jsonl (one cut off in flight
        fails as interrupted), and its finished measured requests make a PARTIAL rung; none finished, NOT_RUN."""
        cfg, work = self.config, self.work.rungs[load]
        c, rate = cfg.concurrency_of(load), load if cfg.open_loop else None
        records = [r for phase in self.in_flight for r in phase if r.t_send or r.done or r.error is not None]
        self.in_flight = []
        for rec in records:
            if not rec.done and rec.error is None:
                rec.error = "interrupted: SIGINT or SIGTERM stopped it in flight"
        self.store.append_records(records, self.epoch, self._failure)
        failures = [f for r in records if (f := self._failure(r)) is not None and not f.startswith("interrupted")]
        if failures:
            return void_from_failures(c, len(records) - len(failures), failures, work.prompt_hash, None, rate)
        measured = [r for r in records if r.phase == "measured" and self._failure(r) is None]
        self.partial.append(f"rate={load:g}" if cfg.open_loop else f"c={load}")
        if not measured:
            return RungNotRun(c, "interrupted: SIGINT or SIGTERM came before a measured request finished", rate)
        audit = self.probe.stop(measured) if self.probe is not None else Audit(0.0, 0.0, 0.0, cfg.audit)
        num_ok = sum(self._failure(r) is None for r in records)
        return RungOk(c, num_ok, work.prompt_hash, rung_stats(measured, cfg.percentiles, cfg.goodput), audit, None,
                      request_rate=rate, num_measured=len(measured), partial=True)

    async def run_repeats(self, load: int | float) -> tuple[RungResult, str | None]:
        """The rung run --repeats times; the first VOID repeat voids it, and no further repeat runs."""
        done: list[RungOk] = []
        measured = []  # every repeat's measured requests count once per request and per content type
        resets = []  # the prefix cache before each repeat: every repeat starts as cold as it can
        for repeat in range(self.config.repeats):
            if self.config.repeats > 1:
                resets.append(await self.ep.reset_prefix_cache())
            self.in_flight, self.probe = [], None
            rung, records, dead = await self.run_rung(load, repeat)
            self.in_flight = []  # written next, with no await between: an interrupt cannot write them twice
            self.store.append_records(records, self.epoch, self._failure)
            if isinstance(rung, RungOk) and (warning := self._trace_len_warning(rung, records)) is not None:
                self.warnings.append(warning)
                self.display.note(f"warning: {warning}")
            if not isinstance(rung, RungOk):
                return rung, dead
            done.append(rung)
            measured += [r for r in records if r.phase == "measured" and self._failure(r) is None]
        if len(done) == 1:
            return done[0], None
        combined = repeats.combine(done)
        return replace(combined, spec_requests=spec_metrics.distribution([r.spec for r in measured]),
                       by_content=content_types.by_content(measured, self.config.percentiles),
                       # a repeat that missed its load flags the rung, as a VOID repeat voids it
                       delivered_load=next((r.delivered_load for r in done if r.delivered_load and r.delivered_load.flag),
                                           combined.delivered_load),
                       repeats={**combined.repeats, "prefix_cache_reset": resets}), None

    def _trace_len_warning(self, rung: RungOk, records: list[RequestRecord]) -> str | None:
        """A trace sized by probing (no --tokenizer) meets its lengths on average, not request by request
        (a block of words is as many tokens as the tokenizer makes of them): say how far each one missed."""
        if self.config.dataset_kind != "trace" or self.work.sizing.get("method") == "tokenizer":
            return None
        asked = {i: r.input_len for i, r in enumerate(self.work.rungs[rung.request_rate].measured)}
        misses = [100 * (rec.prompt_tokens - asked[rec.index]) / asked[rec.index] for rec in records
                  if rec.phase == "measured" and rec.prompt_tokens is not None and asked.get(rec.index)]
        if not misses:
            return None
        worst = max(misses, key=abs)
        return (f"{load_label(rung)}: the trace's prompts, sized by probing without --tokenizer, miss their "
                f"input_length by up to {worst:+.0f}% (mean {sum(misses) / len(misses):+.0f}%) as the server counts "
                f"them; --tokenizer with the server's tokenizer sizes each one exactly")

    def _input_len_warning(self, rung: RungResult) -> str | None:
        """--input-len asks for the server's prompt_tokens: say so when a rung's realised mean is off by
        more than INPUT_LEN_TOLERANCE."""
        asked = self.config.input_len or DEFAULT_INPUT_LEN
        if self.work.dataset["kind"] != "random" or not isinstance(rung, RungOk) or rung.stats.input_tokens is None:
            return None
        # NOTE: a session's later turns carry its history: only its first turn is one prompt of --input-len.
        lengths = rung.turns["1"].input_tokens if rung.turns else rung.stats.input_tokens
        if lengths is None:
            return None
        got = lengths.mean
        flags = f"--input-len {asked}"
        if self.config.prefix_len is not None:
            # --input-len is then the suffix after the shared prefix: a prompt is meant to be both.
            flags = f"--prefix-len {self.config.prefix_len} + {flags}"
            asked += self.config.prefix_len
        if abs(got - asked) <= INPUT_LEN_TOLERANCE * asked:
            return None
        return (f"{load_label(rung)}: the server counted {got:.0f} prompt tokens on average for {flags} "
                f"({100 * (got - asked) / asked:+.0f}%); with --tokenizer, is it the server's tokenizer?")


def workload_size(config: RunConfig) -> tuple[int, int | None]:
    """(requests, output tokens they ask for) over the whole ladder, warmups and repeats included; the
    tokens are None where a dataset or trace sets each request's own length."""
    turns = config.multi_turn or 1
    requests = config.repeats * turns * sum(config.num_prompts(x) + config.num_warmup(x) for x in config.loads)
    out_len = config.output_len or (DEFAULT_OUTPUT_LEN if config.dataset_kind == "random" else None)
    return requests, requests * out_len if out_len else None


def size_note(config: RunConfig) -> str:
    """What the ladder is about to ask for; against the embedded model on a CPU, how long that takes at best."""
    requests, tokens = workload_size(config)
    text = f"this ladder sends {requests:,} requests" + (f" asking for {tokens:,} output tokens" if tokens else "")
    if config.base_url is None and config.serve_cmd is None and tokens:
        hours = tokens / EMBEDDED_CPU_TOK_S / 3600
        text += (f"; the embedded SmolLM2 on a CPU decodes at most about {EMBEDDED_CPU_TOK_S} tok/s, so this takes "
                 f"{hours:.1f} h or more (for a first look: {FIRST_LOOK})")
    return text


def hash_seed(seed: int, load: float) -> int:
    """A stable integer seed for the arrival schedule of one rung."""
    return int.from_bytes(hashlib.sha256(f"ladder-arrivals:{seed}:{load}".encode()).digest()[:8], "little")


def exit_code(rungs: list[RungResult], dead: str | None) -> int:
    if dead is not None:
        return EXIT_ENGINE_DEAD
    return EXIT_VOID if any(isinstance(r, RungVoid) for r in rungs) else EXIT_OK


def default_out_dir(label: str) -> Path:
    return Path("runs") / f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{label}"


class Session:
    """One command's target: the server (started when the ladder runs it), the endpoint every request
    shares, the result store and the manifest, which the first point's workload fills."""

    def __init__(self, config: RunConfig, store: RunStore, display: Display):
        self.config, self.store, self.display = config, store, display
        self.epoch = perf_counter()
        self.base_url, self.serve_cmd = resolve_target(config)
        self.server: ServerProcess | None = None
        self.ep: Endpoint | None = None
        self.info: dict | None = None
        self.dead: str | None = None

    async def __aenter__(self) -> "Session":
        cfg = self.config
        self.ep = await Endpoint(self.base_url, cfg.api_key, cfg.chat, cfg.headers, cfg.insecure,
                                 cfg.api_key_source).__aenter__()
        try:
            if self.serve_cmd:
                self.display.note(f"starting: {redact_cmd(self.serve_cmd)}")
                self.server = ServerProcess(self.serve_cmd, self.store.path("server.log"))
                await self.server.wait_ready(self.ep, cfg.serve_timeout_s)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await self.ep.__aexit__()
        finally:
            if self.server is not None:
                self.server.stop()

    async def ladder(self, config: RunConfig) -> "Ladder":
        """A Ladder over `config`'s loads, its workload prepared; the first one writes the manifest."""
        work = await prepare(config, self.ep)
        if self.info is None:
            self.info = manifest(config, self.base_url, self.serve_cmd, work, self.epoch)
        else:  # a sweep's later points add their rungs' prompt hashes
            self.info["workload"]["rung_prompt_hashes"].update((str(k), w.prompt_hash) for k, w in work.rungs.items())
        self.store.write_manifest(self.info)
        return Ladder(config, self.ep, self.server, work, self.store, self.display, self.epoch,
                      self.info["engine"]["spec_method"])

    def interrupted(self, warnings: list[str], partial: list[str]) -> None:
        """SIGINT or SIGTERM stopped the command: the manifest says so, and which rungs it cut short, so that
        neither a reader nor `ladder compare` takes the rungs it has for a finished ladder."""
        if self.info is None:  # stopped before the first workload: no manifest to mark
            return
        self.info["warnings"] = warnings
        self.info["result"] = {"exit_code": 130, "engine_dead": None, "interrupted": True, "partial_rungs": partial}
        self.store.write_manifest(self.info)

    def finish(self, code: int, extra: dict) -> None:
        self.info.update(extra)
        self.info["result"] = {"exit_code": code, "engine_dead": self.dead}
        host.finish(self.info["host"])
        if self.info["host"]["overloaded"]:  # recorded in the manifest's host; said once here
            load = self.info["host"]["load_average"]
            seen = ", ".join(f"{v['1m']:.1f} at the {k}" for k, v in load.items() if v)
            self.display.note(f"warning: host overloaded: 1-minute load average {seen}, above its "
                              f"{self.info['host']['cpu_count']} cores (host.overloaded in the manifest)")
        self.store.write_manifest(self.info)


async def _run(config: RunConfig, store: RunStore, display: Display) -> int:
    async with Session(config, store, display) as session:
        ladder = await session.ladder(config)
        loads = ",".join(f"{x:g}" for x in config.loads)
        display.note(f"ladder {redact_url(session.base_url)} model={ladder.work.model} dataset={ladder.work.dataset['kind']} "
                     f"{'request-rate' if config.open_loop else 'c'}={loads} -> {store.dir}")
        display.note(size_note(config))
        display.start(len(config.loads))
        try:
            rungs, session.dead = await ladder.run()
        except (asyncio.CancelledError, KeyboardInterrupt):
            session.interrupted(ladder.warnings, ladder.partial)
            raise
        code = exit_code(rungs, session.dead)
        session.info["workload"]["continuous_usage_stats"] = ladder.usage_seen
        session.finish(code, {"warnings": ladder.warnings})
        display.finish()
        return code


async def _sweep(config: RunConfig, spec, store: RunStore, display: Display) -> int:
    from ladder.sweep import run_sweep

    async with Session(config, store, display) as session:
        display.note(f"sweep {redact_url(session.base_url)} -> {store.dir}")
        try:
            code = await run_sweep(config, spec, session, display)
        except (asyncio.CancelledError, KeyboardInterrupt):
            session.interrupted([], [])
            raise
        sweep = rfc_json.loads(store.path("sweep.json").read_text())
        tried = sorted(p["load"] for p in sweep["points"])
        session.info["workload"]["load"] = ({**session.info["workload"]["load"], "request_rate": tried}
                                            if config.open_loop else {"concurrency": tried})
        session.finish(code, {"sweep": sweep})
        return code


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through the Session's exit, which stops a server the ladder started


async def _cancelled_by_signals(command):
    """The command, cancelled by SIGINT or SIGTERM once its loop runs: the cancellation lands at an await,
    never inside a write, so the rung in flight is kept whole (Ladder.run) before the server stops."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    return await command


def run_ladder(config: RunConfig, display: Display, sweep=None) -> int:
    """`ladder run`, or `ladder sweep` with a SweepSpec."""
    store = RunStore(config.out_dir or default_out_dir(config.label))
    store.claim(config.overwrite)
    # NOTE: SIGTERM, and SIGINT too where a non-interactive shell started the ladder in the background
    # (it is then ignored), would otherwise end the ladder and leave its --serve-cmd server running.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return asyncio.run(_cancelled_by_signals(
            _run(config, store, display) if sweep is None else _sweep(config, sweep, store, display)))
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None  # the signal's cancellation, as `ladder` reports it (exit 130)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
