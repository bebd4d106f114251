"""EngineArgs: what a user chooses (CLI flags, LLM kwargs), with every default the user can change.

The engine's limits take their defaults from EngineConfig (their one home); `refengine serve` derives
its flags' defaults from this class. Torch-free, so the command line can read it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from refengine.config import EngineConfig

if TYPE_CHECKING:
    from refengine.model.loader import LoadedModel
    from refengine.spec_decode.adaptive_verification import VerifyCostTable
    from refengine.spec_decode.config import SpeculativeConfig

# The testing hook's environment variable; only the command line reads it (click's envvar).
FAULT_ENV_VAR = "REFENGINE_FAULT_AFTER_STEPS"
DTYPE_NAMES = ("float32", "bfloat16", "float16")

_LIMITS = EngineConfig()


@dataclass(frozen=True)
class EngineArgs:
    model: str | LoadedModel = "smollm2"  # a name or path for load_model, or an already loaded model
    numerics: str = "batch_invariant"
    dtype: str = "float32"
    max_num_seqs: int = _LIMITS.max_num_seqs
    max_num_batched_tokens: int = _LIMITS.max_num_batched_tokens
    long_prefill_token_threshold: int = _LIMITS.long_prefill_token_threshold
    max_model_len: int | None = None  # None: min(the model's context, EngineConfig's max_model_len)
    block_size: int = _LIMITS.block_size
    num_blocks: int | None = None  # None: as many as kv_cache_memory_gib holds
    kv_cache_memory_gib: float = 1.0
    seed: int = _LIMITS.seed
    speculative_config: SpeculativeConfig | None = None
    async_scheduling: bool | None = None  # None: REFENGINE_ASYNC_SCHEDULING, else on where compatible
    enable_prefix_caching: bool = _LIMITS.enable_prefix_caching  # vLLM's automatic prefix caching
    fault_after_steps: int | None = None  # testing: the runner raises after this many steps
    record_steps: bool = False  # keep each request's per-step drafts and acceptance (the oracle reads them)
    device: str | None = None  # None: where the loaded model's weights are (the CPU for files)
    cuda_graphs: bool | None = None  # None: on when the device is a GPU and attention runs in Triton
    # The padded batch sizes captured (vLLM's cuda_graph_sizes); a bigger decode batch runs eagerly. None:
    # 1, 2, 4, 8, then every 8 up to max_num_seqs. Mixed steps (a prefill beside decodes) replay graphs of
    # up to 512 tokens whatever these are (model/graphs.py).
    cuda_graph_sizes: tuple[int, ...] | None = None
    attention_backend: str = "auto"  # for CUDA tensors: auto (Triton when installed), triton, reference
    fused_ops: bool = True  # for CUDA tensors: the fused Triton token-local ops
    skinny_gemm: bool = True  # fast numerics on a GPU: products of 1..8 float32 rows in one Triton kernel
    # SYNTHETIC acceptance for speed studies only: drafts accepted at this fixed rate whatever the
    # target says, so the output is NOT the model's. None: real verification.
    synthetic_acceptance_rate: float | None = None
    # Adaptive verification chooses K by this table instead of one measured at start-up: a fixed table
    # makes its choices the same on every run (the oracle's arms, the tests). None: measured.
    verify_cost_table: VerifyCostTable | None = None
    # Tensor parallelism (vLLM's name): one process per rank, the model sharded by heads and vocabulary.
    tensor_parallel_size: int = 1
    # With batch_invariant numerics: row-parallel products sum in a fixed tree whatever the TP size, so
    # fp32 logits are bitwise equal at every TP size (docs/invariants.md, invariant 46).
    tp_invariant: bool = False
    # testing: this rank skews its logits before sampling, as a drifting rank would (its ids must not win)
    skew_logits_on_rank: int | None = None


DEFAULT_MAX_MODEL_LEN = _LIMITS.max_model_len
