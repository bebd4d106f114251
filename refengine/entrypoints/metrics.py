"""Prometheus metrics under vLLM's names, so tools written for vLLM scrape refengine unchanged.

Engine counters and gauges live in the engine; a collector reads one `stats()` snapshot per scrape,
so a scrape sees a consistent picture and the engine never calls into prometheus_client. Latencies
are timed here, where the HTTP request begins. Every app gets its own CollectorRegistry, so several
apps in one process (tests) never share or collide on metrics.
"""

import time
from collections.abc import Iterator
from dataclasses import asdict

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from refengine.engine.outputs import EngineInfo
from refengine.entrypoints.admission import AdmissionGate
from refengine.entrypoints.engine_client import EngineClient, RequestDelta
from refengine.version import build

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Buckets in seconds, wide enough for a CPU run of a small model and a GPU run of an 8B one.
_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)


class EngineCollector(Collector):
    def __init__(self, engine: EngineClient, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name
        # NOTE: the build (version and git commit) travels with the configuration: two builds of one
        # engine are two engines to a benchmark. Read once here, not on a scrape (it asks git).
        self.version = build().describe()

    def collect(self) -> Iterator[Metric]:
        s = self.engine.stats()
        labels, values = ["model_name"], [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        yield gauge("vllm:num_requests_running", "Requests in the running batch.", s.num_requests_running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", s.num_requests_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).", s.kv_cache_usage)
        yield gauge("refengine:kv_cache_free_blocks", "KV blocks free in the pool.", s.num_free_blocks)
        yield gauge("refengine:kv_cache_total_blocks", "KV blocks in the pool.", s.num_blocks)
        yield counter("vllm:prompt_tokens", "Prompt tokens processed.", s.num_prompt_tokens)
        yield counter("vllm:generation_tokens", "Tokens generated.", s.num_generation_tokens)
        yield counter(
            "vllm:num_preemptions", "Preemptions (requests sent back to waiting).", s.num_preemptions
        )
        yield counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in tokens (admitted requests' tokens).", s.prefix_cache_queries
        )
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", s.prefix_cache_hits)
        yield counter(
            "refengine:prefix_cache_evictions", "Cached KV blocks evicted for new content.", s.num_prefix_cache_evictions
        )
        yield counter("vllm:spec_decode_num_drafts", "Verify steps that carried drafts.", s.spec_num_drafts)
        yield counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", s.spec_num_draft_tokens)
        yield counter(
            "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", s.spec_num_accepted_tokens
        )
        yield counter(
            "refengine:spec_decode_num_grammar_cut_tokens",
            "Draft tokens a structured-output grammar forbade, cut before verification.",
            s.num_grammar_cut_drafts,
        )
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by position in the draft.",
            labels=[*labels, "position"],
        )
        for position, accepted in enumerate(s.spec_num_accepted_tokens_per_pos):
            per_pos.add_metric([*values, str(position)], accepted)
        yield per_pos
        yield gauge(
            "refengine:drafter_random_init",
            "1 if the drafter heads are randomly initialised (acceptance is then meaningless).",
            float(s.drafter_random_init),
        )
        yield gauge(
            "refengine:engine_dead",
            "1 once the engine loop has raised.",
            float(self.engine.dead_reason is not None),
        )
        info = InfoMetricFamily("refengine:engine", "How the engine was configured.", labels=labels)
        fields = {**asdict(self.engine.engine_info), "version": self.version}
        info.add_metric(values, {k: "" if v is None else str(v) for k, v in fields.items()})
        yield info
        yield cache_config_info(self.engine.engine_info, labels, values)


def cache_config_info(info: EngineInfo, labels: list[str], values: list[str]) -> InfoMetricFamily:
    """vLLM's vllm:cache_config_info, under its label names, so that a benchmark reads the KV cache's dtype
    where it reads vLLM's. refengine allocates its KV cache in the compute dtype (engine_args.build_engine),
    so cache_dtype is that dtype, never vLLM's unresolved "auto"."""
    family = InfoMetricFamily("vllm:cache_config", "How the KV cache was configured.", labels=labels)
    family.add_metric(values, {"cache_dtype": info.dtype, "block_size": str(info.block_size),
                               "num_gpu_blocks": str(info.num_blocks),
                               "enable_prefix_caching": str(info.enable_prefix_caching)})
    return family


class ServerMetrics:
    """The metrics of one app, on its own registry."""

    def __init__(self, engine: EngineClient, model_name: str, gate: AdmissionGate) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine, model_name))
        self.request_success = Counter(
            "vllm:request_success",
            "Requests that finished, by finish reason.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.request_failure = Counter(
            "refengine:request_failure",
            "Requests that ended in an error after they reached the engine (engine death included).",
            ["model_name"],
            registry=self.registry,
        )
        self.request_rejected = Counter(
            "refengine:request_rejected",
            "Requests refused before reaching the engine: queue_full (429) or shutting_down (503).",
            ["model_name", "reason"],
            registry=self.registry,
        )
        self.request_aborted = Counter(
            "refengine:request_aborted",
            "Requests ended before their last token: client_disconnect, timeout or shutdown.",
            ["model_name", "reason"],
            registry=self.registry,
        )
        in_flight = Gauge(
            "refengine:requests_in_flight",
            "Requests the server has admitted and not yet answered in full.",
            ["model_name"],
            registry=self.registry,
        )
        in_flight.labels(model_name).set_function(lambda: gate.num_in_flight)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time from the HTTP request to the first generated token.",
            ["model_name"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Time from the HTTP request to the last generated token.",
            ["model_name"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def timer(self) -> "RequestTimer":
        return RequestTimer(self)

    def failed(self) -> None:
        self.request_failure.labels(self.model_name).inc()

    def rejected(self, reason: str) -> None:
        self.request_rejected.labels(self.model_name, reason).inc()

    def aborted(self, reason: str) -> None:
        self.request_aborted.labels(self.model_name, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """Times one request from the moment the server starts driving it: TTFT at its first token,
    end-to-end latency and the finish reason at its last delta."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.start = time.perf_counter()
        self.seen_token = False

    def observe(self, delta: RequestDelta) -> None:
        elapsed = time.perf_counter() - self.start
        labels = self.metrics.model_name
        if delta.token_ids and not self.seen_token:
            self.seen_token = True
            self.metrics.ttft.labels(labels).observe(elapsed)
        if delta.finished:
            self.metrics.request_success.labels(labels, delta.finish_reason or "stop").inc()
            self.metrics.e2e.labels(labels).observe(elapsed)
