"""RunConfig: everything one `ladder run` needs, with every default pinned here, plus the exit codes."""

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
DEFAULT_OUTPUT_LEN = 512  # the reference comparison's workload (1024 in / 512 out), not vLLM's 128
DEFAULT_PROMPTS_PER_CONCURRENCY = 10  # n = 10·c measured requests per rung, as InferenceX runs its points
DEFAULT_TIMEOUT_S = 600.0  # per request, send → stream closed; vLLM has none, so a hung request hangs it
DEFAULT_STALL_TIMEOUT_S = 60.0  # no new chunk from any in-flight request for this long = engine stalled
DEFAULT_SERVE_TIMEOUT_S = 600.0  # --serve-cmd: time allowed for loading weights before /v1/models answers
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
DEFAULT_SEED = 0  # vllm bench serve --seed
DEFAULT_TEMPERATURE = 0.0  # greedy: the acceptance rate of a speculator is then a property of the engine
EMBEDDED_SERVE_CMD = "{refengine} serve --model smollm2 --port {port}"

# The engine keys: `ladder compare` puts runs that differ in any of them under a "not like-for-like"
# banner. Their values come from --metadata k=v, then the server's reports, then the --serve-cmd flags
# (ladder.engine_info).
ENGINE_KEYS = ("engine", "engine_version", "weights", "weight_format", "dtype", "kv_dtype", "numerics",
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
    input_len: int = DEFAULT_INPUT_LEN
    output_len: int = DEFAULT_OUTPUT_LEN
    prompts_per_rung: int | None = None
    prompts_per_concurrency: int = DEFAULT_PROMPTS_PER_CONCURRENCY
    warmup: int = 0
    label: str = "run"
    metadata: dict[str, str] = field(default_factory=dict)
    api_key: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    serve_timeout_s: float = DEFAULT_SERVE_TIMEOUT_S
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    out_dir: Path | None = None
    seed: int = DEFAULT_SEED
    temperature: float = DEFAULT_TEMPERATURE
    tokenizer: Path | None = None
    allow_chunk_count: bool = False
    audit: AuditThresholds = AuditThresholds()

    def num_prompts(self, c: int) -> int:
        return self.prompts_per_rung if self.prompts_per_rung is not None else self.prompts_per_concurrency * c

    def num_warmup(self, c: int) -> int:
        # NOTE: at least one full wave of c requests, so the first measured wave meets a warm engine.
        return max(self.warmup, c)

    @property
    def chat(self) -> bool:
        return self.backend == "openai-chat"
