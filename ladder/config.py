"""RunConfig: everything one `ladder run` needs, with every default pinned here, plus the exit codes."""

import math
from dataclasses import dataclass, field
from pathlib import Path

from ladder.audit import AuditThresholds

# Exit codes (also in `ladder run --help` and ladder/README.md).
EXIT_OK = 0  # every rung OK
EXIT_VOID = 1  # at least one rung VOID, the engine stayed alive
EXIT_USAGE = 2  # bad flags, or the endpoint cannot be used; nothing was measured
EXIT_ENGINE_DEAD = 3  # the engine died; later rungs NOT_RUN

DEFAULT_CONCURRENCIES = (1, 2, 4, 8, 16, 32)
DEFAULT_INPUT_LEN = 1024  # vllm bench serve --random-input-len
FIRST_LOOK = "--c 1,2 --input-len 128 --output-len 64 --prompts-per-concurrency 2"  # a quick ladder
DEFAULT_OUTPUT_LEN = 512  # the reference comparison's workload (1024 in / 512 out), not vLLM's 128
DEFAULT_PROMPTS_PER_CONCURRENCY = 10  # n = 10·c measured requests per rung, as InferenceX runs its points
DEFAULT_TIMEOUT_S = 600.0  # per request, send → stream closed; vLLM has none, so a hung request hangs it
DEFAULT_STALL_TIMEOUT_S = 60.0  # no new chunk from any in-flight request for this long = engine stalled
DEFAULT_SERVE_TIMEOUT_S = 600.0  # --serve-cmd: time allowed for loading weights before /v1/models answers
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
DEFAULT_SEED = 0  # vllm bench serve --seed
DEFAULT_METRICS_INTERVAL_S = 1.0  # /metrics scrape interval while a rung runs
DEFAULT_TEMPERATURE = 0.0  # greedy: the acceptance rate of a speculator is then a property of the engine
INF_RATE_LOAD = max(DEFAULT_CONCURRENCIES)  # --request-rate inf counts as this load when sizing its rung
EMBEDDED_SERVE_CMD = "{refengine} serve --model smollm2 --port {port}"

# The engine keys: `ladder compare` puts runs that differ in any of them under a "not like-for-like"
# banner. Their values come from --metadata k=v, then the server's reports, then the --serve-cmd flags
# (ladder.engine_info).
ENGINE_KEYS = ("engine", "engine_version", "device", "weights", "weight_format", "dtype", "kv_dtype", "numerics",
               "spec_method", "spec_k", "async_scheduling", "max_model_len", "max_num_seqs")


class SetupError(Exception):
    """The run cannot start: bad input, or an endpoint that cannot be used. Exit code 2."""


@dataclass(frozen=True)
class RunConfig:
    base_url: str | None
    serve_cmd: str | None
    model: str | None = None
    backend: str = "openai-chat"
    concurrencies: tuple[int, ...] = DEFAULT_CONCURRENCIES
    request_rates: tuple[float, ...] | None = None  # open loop: one rung per rate, instead of concurrencies
    burstiness: float = 1.0  # gamma shape of the arrival intervals; 1 = Poisson
    max_concurrency: int | None = None  # open loop: at most this many requests in flight
    max_duration_s: float | None = None  # per rung: no request is sent after this many seconds
    dataset: str = "random"  # random | sharegpt[:PATH] | jsonl:PATH | trace:PATH
    max_input_len: int | None = None  # datasets: drop prompts longer than this (needs --tokenizer)
    max_total_len: int | None = None  # datasets: drop requests whose prompt + output exceed this (needs --tokenizer)
    input_len: int | None = None  # random only; None = DEFAULT_INPUT_LEN (with prefix_len: the suffix)
    prefix_len: int | None = None  # random only: every prompt starts with a shared prefix of this many tokens
    num_prefixes: int = 1  # distinct shared prefixes
    output_len: int | None = None  # None = the dataset's lengths (random: DEFAULT_OUTPUT_LEN)
    ignore_eos: bool | None = None  # None = on for random, off for the other datasets
    cache_bust: bool | None = None  # a per-run tag at the start of every prompt; None = on for random only
    prompts_per_rung: int | None = None
    prompts_per_concurrency: int = DEFAULT_PROMPTS_PER_CONCURRENCY
    warmup: int | None = None  # None = c (closed loop) or 0 (open loop)
    label: str = "run"
    metadata: dict[str, str] = field(default_factory=dict)
    api_key: str | None = None
    api_key_source: str | None = None  # "--api-key" or "OPENAI_API_KEY": named when the server refuses the key
    headers: dict[str, str] = field(default_factory=dict)  # --header K=V, redacted in files
    insecure: bool = False  # skip TLS certificate checks
    timeout_s: float = DEFAULT_TIMEOUT_S
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    serve_timeout_s: float = DEFAULT_SERVE_TIMEOUT_S
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    goodput: dict[str, float] = field(default_factory=dict)  # SLO name (ttft, tpot, e2el) -> ms
    out_dir: Path | None = None
    overwrite: bool = False
    seed: int = DEFAULT_SEED
    temperature: float = DEFAULT_TEMPERATURE
    tokenizer: Path | None = None
    allow_chunk_count: bool = False
    save_text: bool = False  # prompt and output of every request in requests.jsonl
    audit: AuditThresholds = AuditThresholds()
    metrics_interval_s: float = DEFAULT_METRICS_INTERVAL_S  # 0: no /metrics series
    repeats: int = 1  # each rung run this many times
    length_dist: str = "uniform"  # random prompts: how input and output lengths spread (ladder.lengths)
    range_ratio: float = 0.0  # 0: every random request has exactly --input-len / --output-len
    top_p: float | None = None  # sampling fields sent on every request (None: not sent)
    top_k: int | None = None
    request_seed: int | None = None
    extra_body: dict = field(default_factory=dict)  # merged into every request body, last
    stream: bool = True  # False: one JSON answer per request, TTFT n/a
    multi_turn: int | None = None  # sessions of this many turns, each resending its history; counts are sessions
    multi_turn_reply: str = "server"  # the reply a session's history carries: "server" (its answer) or "dataset"
    trace_speedup: float = 1.0  # --dataset trace: the timestamps divided by this

    @property
    def body_extra(self) -> dict:
        """The fields every request carries beyond the ladder's own: sampling, then --extra-body."""
        sampling = {"top_p": self.top_p, "top_k": self.top_k, "seed": self.request_seed}
        return {**{k: v for k, v in sampling.items() if v is not None}, **self.extra_body}

    @property
    def open_loop(self) -> bool:
        return self.request_rates is not None

    @property
    def loads(self) -> tuple[int | float, ...]:
        """The rung keys, in order: concurrencies, or request rates in open loop."""
        return self.request_rates if self.request_rates is not None else self.concurrencies

    def num_prompts(self, load: int | float) -> int:
        if self.prompts_per_rung is not None:
            return self.prompts_per_rung
        # NOTE: rate inf ("all at once") has no ceil: it sends as many as its in-flight cap would hold, or as
        # many as the largest default rung (ceil(inf) raises OverflowError).
        size = math.ceil(load) if math.isfinite(load) else self.max_concurrency or INF_RATE_LOAD
        return self.prompts_per_concurrency * max(1, size)

    def num_warmup(self, load: int | float) -> int:
        if self.warmup is not None:
            return self.warmup
        # NOTE: one full wave of c requests, so the first measured wave meets a warm engine.
        return 0 if self.open_loop else int(load)

    def concurrency_of(self, load: int | float) -> int:
        """The in-flight cap of a rung: c, or --max-concurrency (else every request) in open loop."""
        if not self.open_loop:
            return int(load)
        return self.max_concurrency or self.num_prompts(load)

    @property
    def dataset_kind(self) -> str:
        return self.dataset.partition(":")[0]

    @property
    def synthetic(self) -> bool:
        """Prompts of seeded random words: random, and a trace's blocks."""
        return self.dataset_kind in ("random", "trace")

    @property
    def eos_ignored(self) -> bool:
        return self.ignore_eos if self.ignore_eos is not None else self.synthetic

    @property
    def busts_cache(self) -> bool:
        # NOTE: off for datasets by default: a model echoes a tag in real text, and ngram drafting copies it.
        return self.cache_bust if self.cache_bust is not None else self.synthetic

    @property
    def chat(self) -> bool:
        return self.backend == "openai-chat"
