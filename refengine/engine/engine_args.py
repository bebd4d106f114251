"""EngineArgs: what a user chooses (CLI flags, LLM kwargs), resolved into a running EngineCore."""

import logging
import os
from dataclasses import dataclass

import torch

from refengine.config import EngineConfig
from refengine.core.async_scheduler import AsyncScheduler
from refengine.core.scheduler import Scheduler
from refengine.engine.engine_core import EngineCore
from refengine.engine.stop_strings import StopStringChecker
from refengine.model import attention
from refengine.model.device import move_to_device
from refengine.model.kv_cache import KVCache
from refengine.model.loader import LoadedModel, load_model
from refengine.sample.sampler import valid_draft_prefix
from refengine.spec_decode.config import AsyncResolution, SpeculativeConfig, resolve_async_scheduling
from refengine.spec_decode.registry import KVLayout, build_drafter
from refengine.worker.cuda_graphs import CudaGraphs
from refengine.worker.model_runner import ModelRunner

logger = logging.getLogger("refengine")

FAULT_ENV_VAR = "REFENGINE_FAULT_AFTER_STEPS"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineArgs:
    model: str | LoadedModel = "smollm2"  # a name or path for load_model, or an already loaded model
    numerics: str = "batch_invariant"
    dtype: str = "float32"
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: min(the model's context, 2048)
    block_size: int = 16
    num_blocks: int | None = None  # None: as many as kv_cache_memory_gib holds
    kv_cache_memory_gib: float = 1.0
    seed: int = 0
    speculative_config: SpeculativeConfig | None = None
    async_scheduling: bool | None = None  # None: REFENGINE_ASYNC_SCHEDULING, else on where compatible
    fault_after_steps: int | None = None  # None: REFENGINE_FAULT_AFTER_STEPS, else off
    record_steps: bool = False  # keep each request's per-step drafts and acceptance (the oracle reads them)
    device: str | None = None  # None: where the loaded model's weights are (the CPU for files)
    cuda_graphs: bool | None = None  # None: on when the device is a GPU and attention runs in Triton
    # SYNTHETIC acceptance for speed studies only: drafts accepted at this fixed rate whatever the
    # target says, so the output is NOT the model's. None: real verification.
    synthetic_acceptance_rate: float | None = None


@dataclass(frozen=True)
class Engine:
    """A built engine: the core plus what callers need around it."""

    core: EngineCore
    loaded: LoadedModel
    config: EngineConfig
    async_resolution: AsyncResolution
    stop_checker: StopStringChecker


def build_engine(args: EngineArgs) -> Engine:
    if args.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
    resolution = resolve_async_scheduling(args.async_scheduling, args.speculative_config)
    logger.info("async scheduling %s", resolution.reason)
    loaded = (
        args.model
        if isinstance(args.model, LoadedModel)
        else load_model(args.model, dtype=DTYPES[args.dtype], numerics=args.numerics, device=args.device)
    )
    device = torch.device(args.device) if args.device is not None else loaded.model.embed_tokens.weight.device
    if loaded.model.embed_tokens.weight.device != device:
        loaded.model.to(device)
    if args.synthetic_acceptance_rate is not None:
        if not 0.0 <= args.synthetic_acceptance_rate <= 1.0:
            raise ValueError(f"synthetic_acceptance_rate must be in [0, 1], got {args.synthetic_acceptance_rate}")
        logger.warning(
            "SYNTHETIC acceptance rate %.2f: drafts are accepted regardless of the target; outputs are not the "
            "model's (speed studies only)", args.synthetic_acceptance_rate,
        )
    model_config = loaded.config
    max_model_len = args.max_model_len or min(model_config.max_position_embeddings, 2048)
    if max_model_len > model_config.max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_model_len} exceeds the model's context of {model_config.max_position_embeddings}"
        )
    bytes_per_block = (
        2 * model_config.num_hidden_layers * args.block_size * model_config.num_key_value_heads
        * model_config.head_dim * DTYPES[args.dtype].itemsize
    )
    num_blocks = args.num_blocks or int(args.kv_cache_memory_gib * 2**30 // bytes_per_block)
    config = EngineConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=max_model_len,
        block_size=args.block_size,
        num_blocks=num_blocks,
        seed=args.seed,
        speculative_config=args.speculative_config,
        async_scheduling=resolution.enabled,
    )
    config.validate()
    stop_checker = StopStringChecker(loaded.tokenizer)
    if resolution.enabled:
        scheduler = AsyncScheduler(config, stop_checker=stop_checker, draft_validator=valid_draft_prefix)
    else:
        scheduler = Scheduler(config, stop_checker=stop_checker)
    fault = args.fault_after_steps
    if fault is None and os.environ.get(FAULT_ENV_VAR):
        fault = int(os.environ[FAULT_ENV_VAR])
    kv_cache = KVCache.allocate(model_config, num_blocks, args.block_size, dtype=DTYPES[args.dtype], device=device)
    drafter = (
        None
        if args.speculative_config is None
        else build_drafter(args.speculative_config, loaded, KVLayout(num_blocks, args.block_size))
    )
    if drafter is not None and device.type != "cpu":
        move_to_device(drafter, device)  # drafters are built on the host
    if drafter is not None and drafter.random_init:
        logger.warning("speculative method %r runs with randomly initialised head weights", args.speculative_config.method)
    graphs = _cuda_graphs(args, loaded, kv_cache, config, drafter, device)
    runner = ModelRunner(
        loaded.model,
        kv_cache,
        drafter=drafter,
        fault_after_steps=fault,
        record_steps=args.record_steps,
        cuda_graphs=graphs,
        synthetic_acceptance_rate=args.synthetic_acceptance_rate,
    )
    return Engine(EngineCore(scheduler, runner), loaded, config, resolution, stop_checker)


def _cuda_graphs(args: EngineArgs, loaded: LoadedModel, kv_cache: KVCache, config: EngineConfig, drafter, device):
    """Captured decode (and verify) steps, when the device is a GPU and attention runs in Triton."""
    usable = device.type == "cuda" and attention.attention_backend(device) == "triton"
    if args.cuda_graphs is False or not usable:
        if args.cuda_graphs:
            raise ValueError("cuda_graphs needs a CUDA device and the Triton attention backend")
        return None
    spec = args.speculative_config
    query_lens = (1,) if spec is None else (1, spec.num_speculative_tokens + 1)
    lookahead = 0 if spec is None else spec.num_lookahead_slots
    graphs = CudaGraphs(
        loaded.model,
        kv_cache,
        max_num_seqs=config.max_num_seqs,
        max_blocks_per_seq=-(-(config.max_model_len + lookahead) // config.block_size),
        query_lens=query_lens,
        capture_layers=() if drafter is None else tuple(drafter.capture_layers),
    )
    graphs.capture()
    return graphs
