"""build_engine: EngineArgs (what a user chooses) resolved into a running EngineCore."""

import dataclasses
import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from refengine.config import EngineConfig
from refengine.core.async_scheduler import AsyncScheduler, valid_draft_prefix
from refengine.core.scheduler import Scheduler
from refengine.distributed.parallel_layers import shard_model
from refengine.distributed.parallel_state import TPGroup, check_tensor_parallel_size
from refengine.engine.arg_utils import DEFAULT_MAX_MODEL_LEN, DTYPE_NAMES, EngineArgs
from refengine.engine.engine_core import EngineCore
from refengine.engine.stop_strings import StopStringChecker
from refengine.engine.tp_executor import MultiprocExecutor, TensorParallelRunner
from refengine.model import attention
from refengine.model.config import Kernels, Numerics
from refengine.model.device import move_to_device
from refengine.model.graphs import GraphPool, default_batch_sizes, graph_token_sizes
from refengine.model.kv_cache import KVCache
from refengine.model.layers import set_kernels
from refengine.model.loader import LoadedModel, load_model
from refengine.spec_decode.adaptive_verification import AdaptiveVerification
from refengine.spec_decode.config import AsyncResolution, SpeculativeConfig, resolve_async_scheduling
from refengine.spec_decode.draft_graphs import DraftGraphs
from refengine.spec_decode.proposer import Proposer
from refengine.spec_decode.registry import KVLayout, build_proposer
from refengine.structured_output.manager import StructuredOutputManager
from refengine.worker.fault_injection import FaultInjectingRunner, SkewedLogitsModel
from refengine.worker.input_batch import InputBatch
from refengine.worker.model_runner import ModelRunner
from refengine.worker.runner import Runner
from refengine.worker.sampler_graphs import RejectionSamplerGraphs
from refengine.worker.spec_step_graphs import SpecStepGraphs
from refengine.worker.step_plan import Dispatcher
from refengine.worker.step_recorder import StepRecorder
from refengine.worker.synthetic_acceptance import SyntheticAcceptance
from refengine.worker.target_graphs import TargetGraphs
from refengine.worker.verify_cost import cost_batch_sizes, measure_verify_costs

logger = logging.getLogger("refengine")

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
# The context the verify-cost table is measured at, at most (half max_model_len below it).
MAX_COST_CONTEXT = 1024


@dataclass(frozen=True)
class Engine:
    """A built engine: the core plus what callers need around it. `runner` is the model runner itself,
also when the core drives it through a testing wrapper; `step_recorder` is that wrapper under
record_steps."""

    core: EngineCore
    loaded: LoadedModel
    config: EngineConfig
    async_resolution: AsyncResolution
    stop_checker: StopStringChecker
    runner: ModelRunner
    step_recorder: StepRecorder | None
    structured_output_manager: StructuredOutputManager


def build_engine(args: EngineArgs, *, tp_rank: int = 0) -> Engine:
    """`tp_rank` > 0: a worker rank's engine (tp_worker.py), whose runner rank 0 drives; its process group
    is already joined."""
    if args.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
    kernels = Kernels(args.attention_backend, args.fused_ops, args.skinny_gemm)
    resolution = resolve_async_scheduling(args.async_scheduling, args.speculative_config)
    spec = args.speculative_config
    adaptive = spec is not None and spec.enable_adaptive_verification
    if adaptive and args.tensor_parallel_size > 1:
        raise ValueError("enable_adaptive_verification needs tensor_parallel_size 1: the cost table is measured on one rank")
    if args.verify_cost_table is not None and not adaptive:
        raise ValueError("verify_cost_table is adaptive verification's: set enable_adaptive_verification")
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
    if args.cuda_graph_sizes is not None and (
        not args.cuda_graph_sizes or min(args.cuda_graph_sizes) < 1 or max(args.cuda_graph_sizes) > args.max_num_seqs
    ):
        raise ValueError(
            f"cuda_graph_sizes must be batch sizes in 1..max_num_seqs={args.max_num_seqs}, got {list(args.cuda_graph_sizes)}"
        )
    model_config = loaded.config
    check_tensor_parallel_size(
        args.tensor_parallel_size, model_config.num_attention_heads, model_config.num_key_value_heads,
        model_config.vocab_size, model_config.intermediate_size, args.tp_invariant,
    )
    if args.tp_invariant and loaded.model.numerics is not Numerics.BATCH_INVARIANT:
        raise ValueError("tp_invariant is an option of batch_invariant numerics: drop --fast")
    # `is None`, not falsiness: 0 is a value EngineConfig refuses, never "not given".
    max_model_len = (
        min(model_config.max_position_embeddings, DEFAULT_MAX_MODEL_LEN) if args.max_model_len is None else args.max_model_len
    )
    if max_model_len > model_config.max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_model_len} exceeds the model's context of {model_config.max_position_embeddings}"
        )
    # Per rank: the KV cache is sharded by KV head, so a rank's budget holds tp times the blocks.
    bytes_per_block = (
        2 * model_config.num_hidden_layers * args.block_size * model_config.num_key_value_heads
        // args.tensor_parallel_size * model_config.head_dim * DTYPES[args.dtype].itemsize
    )
    num_blocks = args.num_blocks
    if num_blocks is None:
        if not args.kv_cache_memory_gib > 0:
            raise ValueError(f"kv_cache_memory_gib must be > 0, got {args.kv_cache_memory_gib!r}")
        num_blocks = int(args.kv_cache_memory_gib * 2**30 // bytes_per_block)
    config = EngineConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        max_model_len=max_model_len,
        block_size=args.block_size,
        num_blocks=num_blocks,
        seed=args.seed,
        speculative_config=args.speculative_config,
        async_scheduling=resolution.enabled,
        enable_prefix_caching=args.enable_prefix_caching,
    )
    config.validate()
    stop_checker = StopStringChecker(loaded.tokenizer)
    # Cheap to make: the backend is imported, and its tokenizer built, when a request first needs them.
    structured = StructuredOutputManager(loaded.tokenizer, model_config.vocab_size)
    executor, tp_group = _tensor_parallel(args, loaded, tp_rank, device)
    model = loaded.model if tp_group is None else shard_model(loaded.model, tp_group)
    if tp_group is not None and device.type == "cuda":
        tp_group.warm_up(device)
    kv_cache = KVCache.allocate(model.config, num_blocks, args.block_size, dtype=DTYPES[args.dtype], device=device)
    drafter = (
        None
        if args.speculative_config is None
        else build_proposer(args.speculative_config, loaded, KVLayout(num_blocks, args.block_size))
    )
    if drafter is not None and device.type != "cpu":
        move_to_device(drafter, device)  # drafters are built on the host
    _choose_kernels(model, drafter, kernels)
    if drafter is not None and drafter.random_init:
        logger.warning("speculative method %r runs with randomly initialised head weights", args.speculative_config.method)
    accept = None if args.synthetic_acceptance_rate is None else SyntheticAcceptance(args.synthetic_acceptance_rate)
    # A row holds the longest context plus the drafter's lookahead, as its blocks do: under async scheduling
    # the runner's optimistic count (every draft in flight accepted) runs up to k past max_model_len.
    input_batch = InputBatch(
        config.max_num_seqs, config.max_model_len + config.num_lookahead_tokens, _max_blocks_per_req(config), config.block_size
    )
    dispatcher = _captured_graphs(args, model, kv_cache, config, drafter, input_batch, accept, tp_group, device)
    runner = ModelRunner(
        model if args.skew_logits_on_rank != tp_rank else SkewedLogitsModel(model, tp_rank),
        kv_cache,
        input_batch,
        drafter=drafter,
        dispatcher=dispatcher,
        accept=accept,
        tp_group=tp_group,
        num_lookahead_slots=config.num_lookahead_tokens,
    )
    verify_policy = _adaptive_verification(args, config, runner)
    if resolution.enabled:
        scheduler = AsyncScheduler(
            config, stop_checker=stop_checker, draft_validator=valid_draft_prefix, structured_output_manager=structured,
            verify_policy=verify_policy,
        )  # fmt: skip
    else:
        scheduler = Scheduler(config, stop_checker=stop_checker, structured_output_manager=structured, verify_policy=verify_policy)
    # The testing and study hooks wrap the runner; the production path carries none of them.
    driven: Runner = runner
    recorder = None
    if args.record_steps:
        driven = recorder = StepRecorder(runner)
    if executor is not None:
        driven = TensorParallelRunner(driven, executor)
    if args.fault_after_steps is not None:
        driven = FaultInjectingRunner(driven, args.fault_after_steps)
    return Engine(EngineCore(scheduler, driven, executor), loaded, config, resolution, stop_checker, runner, recorder, structured)


def _adaptive_verification(args: EngineArgs, config: EngineConfig, runner: ModelRunner) -> AdaptiveVerification | None:
    """The scheduler's adaptive K, over the given verify-cost table or one measured now with the runner's
    step, at a context of half max_model_len (at most MAX_COST_CONTEXT tokens)."""
    spec = args.speculative_config
    if spec is None or not spec.enable_adaptive_verification:
        return None
    table = args.verify_cost_table
    if table is None:
        context = max(1, min(config.max_model_len // 2, MAX_COST_CONTEXT))
        table = measure_verify_costs(runner, cost_batch_sizes(config.max_num_seqs), spec.num_speculative_tokens, context)
        logger.info("adaptive verification: verify-cost table %s", table)
    return AdaptiveVerification(table)


def _tensor_parallel(
    args: EngineArgs, loaded: LoadedModel, tp_rank: int, device: torch.device
) -> tuple[MultiprocExecutor | None, TPGroup | None]:
    """Rank 0 of a TP engine starts the other ranks; every rank gets its group. TP=1 has a group only in
    the TP-invariant mode (its row-parallel products sum in the same tree as at any TP size)."""
    tp = args.tensor_parallel_size
    if tp == 1:
        return None, TPGroup(0, 1, invariant=True) if args.tp_invariant else None
    if tp_rank > 0:
        return None, TPGroup(tp_rank, tp, args.tp_invariant)
    if dist.is_initialized():
        raise ValueError("a tensor-parallel engine is already running in this process: one at a time")
    if not isinstance(args.model, str):
        raise ValueError("tensor_parallel_size > 1 needs the model by name or path: every rank loads it")
    worker_args = dataclasses.replace(args, numerics=str(loaded.model.numerics), dtype=_dtype_name(loaded.model))
    executor = MultiprocExecutor(tp, device, build_worker_runner, worker_args)
    return executor, TPGroup(0, tp, args.tp_invariant)


def build_worker_runner(args: EngineArgs, tp_rank: int) -> Runner:
    """A worker rank's runner (tp_worker.py), which rank 0 drives: the executor hands this function to
    the ranks it spawns, so the worker needs no import of this module."""
    return build_engine(args, tp_rank=tp_rank).runner


def _dtype_name(model: nn.Module) -> str:
    dtype = model.embed_tokens.weight.dtype
    return next(name for name, value in DTYPES.items() if value == dtype)


def _choose_kernels(model: nn.Module, drafter: Proposer | None, kernels: Kernels) -> None:
    """The kernels this engine asked for, in the target and in the drafter's network (a head module,
    or a plain holder of a draft model's modules)."""
    set_kernels(model, kernels)
    for module in () if drafter is None else drafter.modules:
        set_kernels(module, kernels)


def _max_blocks_per_req(config: EngineConfig) -> int:
    """The most blocks a request can own: its longest context plus the drafter's lookahead slots."""
    return -(-(config.max_model_len + config.num_lookahead_tokens) // config.block_size)


def _query_lens(spec: SpeculativeConfig | None) -> tuple[int, ...]:
    """Tokens per request of the target's uniform steps: 1 and k + 1, and every 1 + K in between when
    adaptive verification may verify fewer drafts (the dispatcher picks among them, step_plan.py)."""
    if spec is None:
        return (1,)
    k = spec.num_speculative_tokens
    return tuple(range(1, k + 2)) if spec.enable_adaptive_verification else (1, k + 1)


def _captured_graphs(
    args: EngineArgs, model: nn.Module, kv_cache: KVCache, config: EngineConfig, drafter: Proposer | None,
    input_batch: InputBatch, accept, tp_group: TPGroup | None, device: torch.device,
) -> Dispatcher:  # fmt: skip
    """The step's dispatcher over the graphs captured into the engine's one pool (model/graphs.py), when
    the device is a GPU and attention runs in Triton: the target's steps, the drafter's, the rejection
    sampler's and the rest of a uniform verify step. Under tensor parallelism the captured forward holds
    the row-parallel all-reduces; the uniform step, which would skip the broadcast of the sampled ids
    between verify and draft, goes the general way."""
    spec = args.speculative_config
    k = 0 if spec is None else spec.num_speculative_tokens
    capture_layers = () if drafter is None else tuple(drafter.capture_layers)
    usable = device.type == "cuda" and attention.attention_implementation(model.kernels, device) == "triton"
    if args.cuda_graphs is False or not usable:
        if args.cuda_graphs:
            raise ValueError("cuda_graphs needs a CUDA device and the Triton attention backend")
        return Dispatcher(k, input_batch, None, None, None, None, capture_layers)
    pool = GraphPool(device)
    batch_sizes = default_batch_sizes(config.max_num_seqs) if args.cuda_graph_sizes is None else sorted(set(args.cuda_graph_sizes))
    width = _max_blocks_per_req(config)
    target = TargetGraphs(
        model, kv_cache, graph_token_sizes(batch_sizes, _query_lens(spec), config.max_num_batched_tokens),
        batch_sizes, max_num_seqs=config.max_num_seqs, max_logits=config.max_num_seqs * (k + 1),
        max_blocks_per_seq=width, capture_layers=capture_layers,
    )  # fmt: skip
    target.capture(pool)
    device_drafter = None if drafter is None else drafter.device_drafter
    drafts = sampler = uniform = None
    if device_drafter is not None:
        # Its whole step after a verify step, and its proposal, at the target's padded batch sizes.
        target_hidden = (model.config.hidden_size, model.embed_tokens.weight.dtype)
        drafts = DraftGraphs(device_drafter, target_hidden, width, batch_sizes, device)
        drafts.capture(pool)
        device_drafter.use_graphs(drafts)
    if spec is not None:
        sampler = RejectionSamplerGraphs(model.config.vocab_size, k, batch_sizes, device, accept)
        sampler.capture(pool)
    if drafts is not None and tp_group is None:
        uniform = SpecStepGraphs(sampler, drafts, device)
        uniform.capture(pool, lambda t: target.graphs.output(t) if target.graphs.holds(t) else None)
    return Dispatcher(k, input_batch, target, sampler, uniform, drafts, capture_layers)
