"""GPU benchmark of the reference engine on random-weight models at real shapes, in one run.

    PYTHONPATH=. python3 benchmarks/gpu_bench.py --out $OUT [--budget-s 420] [--commit SHA]

Sections, each timed and guarded (a failure is recorded and the next section runs; a section that
would start past the budget is skipped and recorded as such):

  bandwidth   device-to-device copy, bytes read + written per second
  steps       qwen3-8b bf16 model steps (forward + logits, no engine): decode and verify (k + 1 = 5 rows per
              sequence) at c = 1, 8, 32, each with reference attention (eager), Triton attention (eager) and
              Triton attention in CUDA graphs; the batch-invariant mode in graphs; the K/V bytes the attention
              kernel reads per step, a program per token against a program per window (invariant 52)
  profile     kernel time of one c = 1 decode step by kind (matrix products, attention, the rest)
  engine      qwen3-8b TPOT and output tok/s through the engine (1024-token prompts, 256 new tokens,
              greedy, ignore_eos) at c = 1, 8, 32, async and sync alternating, with a 2048-token budget
              and with every prompt prefilled in one step
  gpu_idle    GPU idle time under async from a profiler trace: all of it, and between consecutive steps
  async_ab    EAGLE drafter (random head) k = 4 with SYNTHETIC acceptance, async on vs off, c = 1, 8 and 32
  adaptive_k  adaptive verification against spec off and fixed k = 4 (EAGLE, SYNTHETIC acceptance 0.3 and
              0.7, async, every prompt prefilled in one step) at c = 1, 8 and 64: TPOT and the K it chose
  spec_profile  that EAGLE step at c = 1 and 8 (async, acceptance 0.7, 16 in / 64 out), phase by phase: host
              ms, host waits on the device and device stream ms per step, device busy and idle from a trace
  hf          HF transformers generate on the same weights (bf16, sdpa, dynamic cache)
  heads_profile  the embedded SmolLM2 with spec off and each shipped head (k = 4, async), c = 1 and 8: wall
              per step, host ms per phase, the device's busy time and kernels per step by kind,
              acceptance length
  oracle      the token-identity oracle's arms on the GPU for qwen3-0.6b in float32 batch-invariant mode

Every figure carries: the attention implementation that ran (counted), whether CUDA graphs replayed,
and the roofline fraction floor / measured, floor = (weight bytes + KV bytes read per step) / 4.21 TB/s
(the issue's copy bandwidth for this GPU; the measured copy bandwidth is recorded beside it).
A short table is printed last; everything goes to OUT/gpu_bench.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refengine.engine.llm import LLM  # noqa: E402
from refengine.model import attention, triton_attention  # noqa: E402
from refengine.model.attention_metadata_builder import build_attention_metadata  # noqa: E402
from refengine.model.config import Kernels, Numerics  # noqa: E402
from refengine.model.graphs import GraphPool, graph_token_sizes, padded_batch_size  # noqa: E402
from refengine.model.kv_cache import KVCache  # noqa: E402
from refengine.model.layers import set_kernels  # noqa: E402
from refengine.model.roofline import kv_bytes_per_token, weight_bytes_per_step  # noqa: E402
from refengine.model.shapes import build_random_model  # noqa: E402
from refengine.oracle.prompts import TEXT_PROMPTS  # noqa: E402
from refengine.sampling_params import SamplingParams  # noqa: E402
from refengine.spec_decode.config import SpeculativeConfig  # noqa: E402
from refengine.tokenizer.chat_template import ChatMessage  # noqa: E402
from refengine.worker import model_runner  # noqa: E402
from refengine.worker.device_inputs import DeviceInputIndices  # noqa: E402
from refengine.worker.target_graphs import TargetGraphs  # noqa: E402

BANDWIDTH = 4.21e12  # bytes/s, the copy bandwidth for this H200 type
PROMPT_LEN = 1024
OUTPUT_LEN = 256
MID_CONTEXT = PROMPT_LEN + OUTPUT_LEN // 2  # the average context a decode step reads over a run
ADAPTIVE_C = (1, 8, 64)  # the adaptive_k section's concurrencies
BLOCK = 16
DEV = "cuda"
# --dry-run: the same code on the CPU with shrunken shapes, to catch mistakes before a GPU run.
OVERRIDES: dict = {}
DRY_OVERRIDES = {"num_hidden_layers": 2, "vocab_size": 1000, "hidden_size": 128, "intermediate_size": 256,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def empty_cache() -> None:
    gc.collect()
    if DEV == "cuda":
        torch.cuda.empty_cache()


class Bench:
    def __init__(self, out: Path, budget_s: float, commit: str) -> None:
        self.out = out
        self.started = time.perf_counter()
        self.budget_s = budget_s
        self.results: dict = {
            "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            # The device the figures are of, for reports/README.md (benchmarks/reports_index.py reads it).
            "device": torch.cuda.get_device_name() if DEV == "cuda" else "CPU",
            "bandwidth_reference_Bps": BANDWIDTH,
            "sections": {},
            "rows": [],
        }

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def section(self, name: str, fn, *, needs_s: float) -> None:
        if self.elapsed() + needs_s > self.budget_s:
            self.results["sections"][name] = {"status": f"skipped: {self.elapsed():.0f} s used, needs ~{needs_s:.0f} s"}
            print(f"[bench] skip {name}", flush=True)
            self.save()
            return
        t0 = time.perf_counter()
        print(f"[bench] {name} at {self.elapsed():.0f} s", flush=True)
        try:
            fn()
            status = "ok"
        except Exception as err:  # recorded; the next section still runs
            status = f"error: {err!r}"
            traceback.print_exc()
        self.results["sections"][name] = {"status": status, "seconds": round(time.perf_counter() - t0, 1)}
        empty_cache()
        self.save()

    def row(self, **row) -> None:
        self.results["rows"].append(row)
        print("[row] " + json.dumps(row), flush=True)

    def save(self) -> None:
        self.results["elapsed_s"] = round(self.elapsed(), 1)
        (self.out / "gpu_bench.json").write_text(json.dumps(self.results, indent=1, default=str))


# ---- helpers ---------------------------------------------------------------------------------------
def floor_ms(loaded, num_seqs: int, context: int, dtype=torch.bfloat16) -> float:
    weight = weight_bytes_per_step(loaded.config, dtype)
    kv = num_seqs * context * kv_bytes_per_token(loaded.config, dtype)
    return (weight + kv) / BANDWIDTH * 1e3


def attention_kv_bytes(config, num_seqs: int, q: int, context: int, dtype=torch.bfloat16) -> dict:
    """K/V bytes the Triton split kernel reads in one step of num_seqs sequences of q rows ending at `context`,
    over all layers: a program per token (the kernel before invariant 52) against a program per window of
    rows; `windows_mean`: the windowed figure averaged over contexts context .. context + rows - 1 (every place
the q rows can fall in a window, as a run's steps do)."""
    rows = triton_attention.rows_per_program(config.num_attention_heads // config.num_key_value_heads)

    def read(rows_per_program: int, ctx: int = context) -> int:
        per_layer = triton_attention.kv_bytes_read([q] * num_seqs, [ctx] * num_seqs, config.num_key_value_heads,
                                                   config.head_dim, dtype.itemsize, rows_per_program)
        return config.num_hidden_layers * per_layer

    mean = sum(read(rows, context + shift) for shift in range(rows)) / rows
    return {"per_token": read(1), "windows": read(rows), "windows_mean": round(mean), "rows_per_program": rows}


def set_numerics(model: torch.nn.Module, numerics: Numerics) -> None:
    for module in model.modules():
        if hasattr(module, "numerics"):
            module.numerics = numerics


def random_cache(loaded, num_blocks: int, dtype=torch.bfloat16) -> KVCache:
    cache = KVCache.allocate(loaded.config, num_blocks, BLOCK, dtype=dtype, device=DEV)
    generator = torch.Generator(device=DEV).manual_seed(1)
    for layer in cache.layers:  # never time on zeros
        layer.key.normal_(generator=generator)
        layer.value.normal_(generator=generator)
    return cache


def step_inputs(num_seqs: int, q: int, context: int, blocks_per_seq: int, vocab: int):
    ids = torch.randint(0, vocab, (num_seqs * q,))
    positions = torch.tensor([p for _ in range(num_seqs) for p in range(context - q, context)])
    block_ids = [list(range(s * blocks_per_seq, (s + 1) * blocks_per_seq)) for s in range(num_seqs)]
    meta = build_attention_metadata([context - q] * num_seqs, [q] * num_seqs, block_ids, BLOCK)
    return ids, positions, meta


def time_ms(fn, iters: int, warmup: int = 2) -> tuple[float, float]:
    """Median and min wall ms per call, synchronised after each call (host overhead included)."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def calls_delta(before: dict) -> str:
    now = dict(attention.ATTENTION_CALLS)
    ran = [name for name in ("triton", "reference") if now.get(name, 0) > before.get(name, 0)]
    return "+".join(ran) or "none"


def kernel_kind(name: str) -> str:
    """A device event's kind, by its kernel name."""
    low = name.lower()
    if "split_kernel" in low or "combine_kernel" in low or "store_kv" in low:
        return "attention (triton)"
    if any(s in low for s in ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas", "matmul")):
        return "matrix products"
    if "memcpy" in low or "memset" in low:
        return "copies"
    return "elementwise/norm/rotary/other"


def mark():
    """A point in the device stream's order: a recorded CUDA event; in the dry run, the host clock."""
    if DEV != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def marks_ms(entry, exit_) -> float:
    return entry.elapsed_time(exit_) if DEV == "cuda" else (exit_ - entry) * 1e3


class Phases:
    """Where an engine step's time goes, from wrappers set on the engine's instances (study hooks stay
    out of the engine; close() takes them off again): host wall seconds and calls per label, and for
    the phases that launch device work (`stream`) the device stream's time from the wrapper's entry to
    its exit in stream order: the phase's kernels and copies plus the gaps where the device waited for
    the phase's launches. Stream marks are CUDA events, so they hold on any host thread; the runner
    works on the engine's runner thread, whose CPU ranges torch.profiler does not record."""

    def __init__(self) -> None:
        self.host: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.marks: dict[str, list] = defaultdict(list)
        self.labels: list[str] = []  # every label wrapped, called or not
        self._undo: list[tuple[object, str, object]] = []

    def wrap(self, obj, name: str, label: str, *, stream: bool = False) -> None:
        original = getattr(obj, name)
        self.labels.append(label)

        def wrapper(*args, **kwargs):
            entry = mark() if stream else None
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                t1 = time.perf_counter()
                self.host[label] += t1 - t0
                self.calls[label] += 1
                if stream:
                    self.marks[label].append((entry, mark()))

        own = name in vars(obj)  # an instance attribute (runner.accept) is put back, a method uncovered
        setattr(obj, name, wrapper)
        self._undo.append((obj, name, original if own else None))

    def close(self) -> None:
        for obj, name, original in reversed(self._undo):
            if original is None:
                delattr(obj, name)
            else:
                setattr(obj, name, original)
        self._undo = []

    def stream_ms(self, label: str) -> float:
        sync()
        return sum(marks_ms(entry, exit_) for entry, exit_ in self.marks[label])


# ---- sections --------------------------------------------------------------------------------------
def bandwidth(bench: Bench) -> None:
    if DEV != "cuda":
        return
    n = 2 * 2**30
    src = torch.randn(n // 4, device=DEV)
    dst = torch.empty_like(src)
    med, best = time_ms(lambda: dst.copy_(src), iters=20)
    bench.results["bandwidth_measured_Bps"] = 2 * n / (med / 1e3)
    props = torch.cuda.get_device_properties(0)
    bench.results["device"] = {"name": props.name, "sms": props.multi_processor_count, "memory_gib": props.total_memory / 2**30}
    print(f"[bench] copy {2 * n / (med / 1e3) / 1e12:.2f} TB/s (read + write)", flush=True)
    src = dst = None  # noqa: F841


class Qwen8b:
    loaded = None


def get_qwen8b():
    if Qwen8b.loaded is None:
        t0 = time.perf_counter()
        Qwen8b.loaded = build_random_model("qwen3-8b", seed=0, dtype=torch.bfloat16, numerics=Numerics.FAST, device=DEV,
                                           **OVERRIDES)
        sync()
        print(f"[bench] qwen3-8b random weights on the GPU in {time.perf_counter() - t0:.1f} s", flush=True)
    return Qwen8b.loaded


def target_graphs(model, cache, batches, q: int, blocks_per_seq: int) -> TargetGraphs:
    """The target's graphs of uniform steps of `batches` requests of q tokens (no mixed-step sizes)."""
    sizes = graph_token_sizes(batches, (q,), max(batches) * q)
    return TargetGraphs(model, cache, sizes, list(batches), max_num_seqs=max(batches), max_logits=max(batches) * q,
                        max_blocks_per_seq=blocks_per_seq)


def replay(g: TargetGraphs, ids, positions, meta):
    """One step through the target's graph that holds it, with nothing in flight to complete."""
    n = meta.seq_lens.shape[0]
    seq_of_token = np.repeat(np.arange(n), np.diff(meta.query_start_loc.numpy()))
    indices = DeviceInputIndices.build([], [], [-1] * n, [0] * n, seq_of_token)
    size = padded_batch_size(ids.shape[0], g.token_sizes)
    return g.run(size, ids, positions, meta, torch.arange(ids.shape[0]), indices, None)


def model_steps(bench: Bench) -> None:
    loaded = get_qwen8b()
    model = loaded.model
    blocks_per_seq = -(-(PROMPT_LEN + OUTPUT_LEN + 8) // BLOCK)
    cache = random_cache(loaded, 32 * blocks_per_seq + 4)
    vocab = loaded.config.vocab_size
    for q, batches in ((1, (1, 8, 32)), (5, (1, 8, 32))):
        kind = "decode" if q == 1 else "verify k=4"
        graphs = {}
        setups = [("fast", Numerics.FAST, True), ("batch_invariant", Numerics.BATCH_INVARIANT, True)]
        if q == 1:
            setups.append(("fast-unfused", Numerics.FAST, False))
        for key, numerics, fused in setups if DEV == "cuda" else ():
            set_numerics(model, numerics)
            set_kernels(model, Kernels(fused_ops=fused))
            # A budget of the largest batch's tokens: the uniform sizes alone, no mixed-step graphs.
            g = target_graphs(model, cache, batches, q, blocks_per_seq)
            t0 = time.perf_counter()
            try:
                g.capture(GraphPool(DEV))
            finally:
                set_kernels(model, Kernels())
            graphs[key] = g
            bench.results.setdefault("capture_s", {})[f"{kind}/{key}"] = round(time.perf_counter() - t0, 1)
        for c in batches:
            ids, positions, meta = step_inputs(c, q, MID_CONTEXT, blocks_per_seq, vocab)
            floor = floor_ms(loaded, c, MID_CONTEXT)
            variants = [("reference", "eager", "fast"), ("triton", "eager", "fast"), ("triton", "graph", "fast"),
                        ("triton", "graph", "batch_invariant")]
            if q == 1 and c == 1:
                variants.append(("triton", "graph", "fast-unfused"))
            if c == 32:
                variants = [v for v in variants if v[0] != "reference"]
            for backend, mode, key in variants:
                if mode == "graph" and DEV != "cuda":
                    continue
                numerics = Numerics.BATCH_INVARIANT if key == "batch_invariant" else Numerics.FAST
                set_numerics(model, numerics)
                set_kernels(model, Kernels(attention="reference" if backend == "reference" else "auto"))
                before = dict(attention.ATTENTION_CALLS)
                g = graphs.get(key)
                replays = g.graphs.stats.num_replays if g else 0
                with torch.inference_mode():
                    if mode == "graph":
                        fn = lambda g=g, ids=ids, positions=positions, meta=meta: replay(g, ids, positions, meta)  # noqa: E731
                    else:
                        dev_ids, dev_pos = ids.to(DEV), positions.to(DEV)

                        def fn(dev_ids=dev_ids, dev_pos=dev_pos, meta=meta):
                            m = meta.to(DEV)
                            out = model(dev_ids, dev_pos, m, cache)
                            return model.compute_logits(out.hidden_states)

                    iters = 5 if backend == "reference" else 30
                    med, best = time_ms(fn, iters=iters)
                    gpu_ms = None
                    if mode == "graph":
                        # The step's GPU time: CUDA events around 30 replays queued back to back (the host
                        # stages each step while the previous one runs), per replay.
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        for _ in range(30):
                            fn()
                        end.record()
                        end.synchronize()
                        gpu_ms = start.elapsed_time(end) / 30
                ran = calls_delta(before) if mode == "eager" else "triton (captured)"
                bench.row(section="steps", what=f"qwen3-8b {kind} step", c=c, context=MID_CONTEXT,
                          numerics=numerics.value, fused_ops=key != "fast-unfused", attention=ran,
                          cuda_graphs=mode == "graph",
                          graph_replays=(g.graphs.stats.num_replays if g else 0) - replays, ms=round(med, 3), ms_min=round(best, 3),
                          gpu_ms=None if gpu_ms is None else round(gpu_ms, 3),
                          floor_ms=round(floor, 3), roofline=round(floor / med, 3),
                          attention_kv_bytes=attention_kv_bytes(loaded.config, c, q, MID_CONTEXT))
        del graphs
        gc.collect()
    set_numerics(model, Numerics.FAST)
    set_kernels(model, Kernels())
    # the step timing context for the report
    bench.results["weight_bytes_per_step"] = weight_bytes_per_step(loaded.config, torch.bfloat16)
    bench.results["kv_bytes_per_token"] = kv_bytes_per_token(loaded.config, torch.bfloat16)
    Qwen8b.cache = cache


def profile_step(bench: Bench) -> None:
    from torch.profiler import ProfilerActivity, profile

    if DEV != "cuda":
        return
    loaded = get_qwen8b()
    model = loaded.model
    cache = getattr(Qwen8b, "cache", None) or random_cache(loaded, 90)
    blocks_per_seq = -(-(PROMPT_LEN + OUTPUT_LEN + 8) // BLOCK)
    ids, positions, meta = step_inputs(1, 1, MID_CONTEXT, blocks_per_seq, loaded.config.vocab_size)
    g = target_graphs(model, cache, [1], 1, blocks_per_seq)
    g.capture(GraphPool(DEV))
    with torch.inference_mode():
        for _ in range(3):
            replay(g, ids, positions, meta)
        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                replay(g, ids, positions, meta)
            sync()
    kinds: dict[str, float] = defaultdict(float)
    names: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = event.device_time if hasattr(event, "device_time") else event.cuda_time
        name = event.name
        kinds[kernel_kind(name)] += us / 5 / 1e3
        names[name[:90]] += us / 5 / 1e3
    top = sorted(names.items(), key=lambda kv: -kv[1])[:15]
    total = sum(kinds.values())
    bench.results["profile_c1_decode_graph"] = {
        "kernel_ms_per_step_by_kind": {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "kernel_ms_per_step_total": round(total, 3),
        "top_kernels_ms_per_step": [(n, round(v, 3)) for n, v in top],
        "weight_floor_ms": round(floor_ms(loaded, 0, 0), 3),
    }
    print(json.dumps(bench.results["profile_c1_decode_graph"], indent=1), flush=True)


def timed_generate(llm: LLM, prompts, params, batch_queue: bool | None):
    core = llm.engine.core
    name = "step_with_batch_queue" if (batch_queue if batch_queue is not None else core.max_concurrent_batches > 1) else "step"
    original = getattr(core, name)
    arrivals: dict[str, list[tuple[float, int]]] = defaultdict(list)
    step_times: list[float] = []

    def timed():
        t0 = time.perf_counter()
        out = original()
        t = time.perf_counter()
        step_times.append(t - t0)
        if out is not None:
            for o in out.outputs:
                if o.new_token_ids:
                    arrivals[o.req_id].append((t, len(o.new_token_ids)))
        return out

    setattr(core, name, timed)
    t0 = time.perf_counter()
    try:
        outs = llm.generate(prompts, params, batch_queue=batch_queue)
    finally:
        delattr(core, name)  # the engine's own step again, for the next run
    wall = time.perf_counter() - t0
    tpots, ttfts, gaps = [], [], []
    for req_arrivals in arrivals.values():
        total = sum(n for _, n in req_arrivals)
        if total > 1:
            tpots.append((req_arrivals[-1][0] - req_arrivals[0][0]) / (total - 1) * 1e3)
        ttfts.append((req_arrivals[0][0] - t0) * 1e3)
        # Per-token gaps between consecutive arrivals: their median is the steady decode step, free of
        # the prefill steps of later requests that TPOT averages in.
        gaps += [(b[0] - a[0]) / b[1] * 1e3 for a, b in zip(req_arrivals, req_arrivals[1:])]
    total_tokens = sum(len(o.token_ids) for o in outs)
    return {
        "tpot_ms": statistics.mean(tpots),
        "itl_median_ms": statistics.median(gaps) if gaps else float("nan"),
        "ttft_ms_mean": statistics.mean(ttfts),
        "output_tok_s": total_tokens / wall,
        "wall_s": wall,
        "step_s": sum(step_times),
        "steps": len(step_times),
        "tokens": total_tokens,
    }


def engine_run(bench: Bench, loaded, c: int, *, label: str, output_len: int = OUTPUT_LEN, spec=None,
               synthetic=None, async_scheduling=None, batch_queue=None, cuda_graphs=None,
               max_num_batched_tokens: int = 2048) -> dict:
    generator = torch.Generator().manual_seed(c)
    prompts = [torch.randint(0, 500, (PROMPT_LEN,), generator=generator).tolist() for _ in range(c)]
    max_len = PROMPT_LEN + output_len + 16
    tokens_needed = c * (max_len + 16 + 8)
    kv_gib = tokens_needed * kv_bytes_per_token(loaded.config, torch.bfloat16) / 2**30 + 0.25
    before = dict(attention.ATTENTION_CALLS)
    # What earlier engines of this process left reserved: a pool they still hold shows here and can slow this one.
    reserved_gib = torch.cuda.memory_reserved() / 2**30 if DEV == "cuda" else 0.0
    t0 = time.perf_counter()
    llm = LLM(loaded, dtype="bfloat16", numerics=loaded.model.numerics.value, max_num_seqs=c, max_model_len=max_len,
              block_size=BLOCK, kv_cache_memory_gib=kv_gib, max_num_batched_tokens=max_num_batched_tokens, speculative_config=spec,
              synthetic_acceptance_rate=synthetic, async_scheduling=async_scheduling, cuda_graphs=cuda_graphs)
    build_s = time.perf_counter() - t0
    runner = llm.engine.core.runner
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    # Warm-up with the same batch (shorter): every kernel variant the timed run needs (per batch size,
    # per step shape, the drafter's too) is compiled outside the timed run.
    llm.generate([p[:128] for p in prompts], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
                 batch_queue=batch_queue)
    graph_steps, eager_steps = runner.num_graph_steps, runner.num_eager_steps
    drafter = runner.drafter
    drafter_steps = (drafter.num_graph_steps, drafter.num_eager_steps) if spec is not None else (0, 0)
    uniform = runner.dispatcher.uniform
    uniform_steps = 0 if uniform is None else uniform.graphs.stats.num_replays
    policy = llm.engine.core.scheduler.verify_policy
    chosen_before = [] if policy is None else list(policy.num_chosen)
    timing = timed_generate(llm, prompts, params, batch_queue)
    stats = llm.engine.core.scheduler.spec_decoding_stats
    llm.engine.core.shutdown()
    decode_steps = runner.num_graph_steps - graph_steps
    tokens_per_step = None
    if spec is not None and stats.num_drafts:
        tokens_per_step = 1 + stats.num_accepted_tokens / stats.num_drafts
    floor = floor_ms(loaded, c, MID_CONTEXT)  # one step's floor; per token divide by tokens per step
    per_token_floor = floor / (tokens_per_step or 1)
    row = dict(section="engine", what=label, c=c, prompt=PROMPT_LEN, output=output_len,
               max_num_batched_tokens=max_num_batched_tokens,
               numerics=loaded.model.numerics.value, attention=calls_delta(before),
               cuda_graphs=decode_steps > 0, graph_steps=decode_steps, eager_steps=runner.num_eager_steps - eager_steps,
               async_scheduling=llm.engine.async_resolution.enabled, batch_queue=batch_queue,
               tpot_ms=round(timing["tpot_ms"], 3), itl_median_ms=round(timing["itl_median_ms"], 3),
               output_tok_s=round(timing["output_tok_s"], 1),
               ttft_ms=round(timing["ttft_ms_mean"], 1), steps=timing["steps"],
               floor_ms=round(per_token_floor, 3), roofline=round(per_token_floor / timing["tpot_ms"], 3),
               build_s=round(build_s, 1), reserved_gib_before_build=round(reserved_gib, 2), in_flight_steps=runner.num_in_flight_steps,
               overlapped_launches=runner.num_overlapped_launches)
    if spec is not None:
        # The drafter's proposals in the timed run replayed from its CUDA graphs, and those run eagerly.
        # Uniform verify steps verify and draft in their own graph (spec_step_graphs.py), not the drafter's.
        row.update(drafter_graph_steps=drafter.num_graph_steps - drafter_steps[0],
                   drafter_eager_steps=drafter.num_eager_steps - drafter_steps[1],
                   uniform_step_graph_steps=0 if uniform is None else uniform.graphs.stats.num_replays - uniform_steps)
        row.update(method=spec.method, k=spec.num_speculative_tokens, synthetic_acceptance=synthetic,
                   acceptance=round(stats.num_accepted_tokens / max(stats.num_draft_tokens, 1), 3),
                   tokens_per_step=round(tokens_per_step or 1, 3),
                   wall_ms_per_engine_step=round(timing["wall_s"] * 1e3 / max(timing["steps"], 1), 3))
    if policy is not None:
        # Adaptive verification: request-steps of the timed run at each K, and their mean K.
        chosen = [n - b for n, b in zip(policy.num_chosen, chosen_before, strict=True)]
        row.update(adaptive=True, chosen_k=chosen, mean_k=round(sum(k * n for k, n in enumerate(chosen)) / max(sum(chosen), 1), 3),
                   verify_cost_ms={f"b={b}": [round(x * 1e3, 3) for x in sec]
                                   for b, sec in zip(policy.table.batch_sizes, policy.table.seconds, strict=True)})
    bench.row(**row)
    del llm
    empty_cache()
    return row


def engine_section(bench: Bench) -> None:
    loaded = get_qwen8b()
    Qwen8b.cache = None
    empty_cache()
    # Async and sync alternate, the first of a pair swapping from c to c, so that neither always runs
    # first. With a 2048-token budget the later prompts' prefills run between the first requests' decode
    # steps and TPOT averages them in; with a budget of c x 1024 every prompt is prefilled in the first
    # step and TPOT is the decode step alone.
    for budget in (2048, None):
        for i, c in enumerate((1, 8, 32)):
            tokens = budget or c * PROMPT_LEN
            prefill = "2048-token budget" if budget else "all prompts prefilled in one step"
            for async_on in ((True, False) if i % 2 == 0 else (False, True)):
                engine_run(bench, loaded, c, max_num_batched_tokens=max(tokens, PROMPT_LEN),
                           label=f"qwen3-8b greedy, {'async default' if async_on else 'sync (async off)'}, graphs, "
                                 f"{prefill}",
                           async_scheduling=None if async_on else False)
    engine_run(bench, loaded, 1, label="qwen3-8b greedy, no graphs (eager triton), 64 new tokens",
               output_len=64, cuda_graphs=False)


def async_ab(bench: Bench) -> None:
    loaded = get_qwen8b()
    spec = SpeculativeConfig("eagle", 4)
    for c in (1, 8, 32):  # the three targets: 0.5x, 0.6x, 0.8x no-spec async
        for repeat, order in ((1, (False, True)), (2, (True, False)), (3, (False, True))):
            for on in order:
                engine_run(bench, loaded, c,
                           label=f"EAGLE k=4 SYNTHETIC acceptance 0.7, async {'on' if on else 'off'} (run {repeat})",
                           spec=spec, synthetic=0.7, async_scheduling=on, batch_queue=on)


def adaptive_k(bench: Bench) -> None:
    """Adaptive verification never loses (issue 52): spec off, fixed k = 4 and adaptive K at synthetic
    acceptance 0.3 and 0.7, c = 1, 8, 64, async, every prompt prefilled in one step; the arms of one c
    alternate their order. Rows carry TPOT, the K chosen per request-step and the measured cost table."""
    loaded = get_qwen8b()
    fixed, adaptive = SpeculativeConfig("eagle", 4), SpeculativeConfig("eagle", 4, enable_adaptive_verification=True)
    for i, c in enumerate(ADAPTIVE_C):
        arms = [("spec off", None, None)] + [
            (f"{name}, SYNTHETIC acceptance {rate}", spec, rate) for rate in (0.3, 0.7)
            for name, spec in (("EAGLE k=4 fixed", fixed), ("EAGLE k=4 adaptive", adaptive))
        ]
        for label, spec, rate in arms if i % 2 == 0 else arms[::-1]:
            engine_run(bench, loaded, c, label=f"qwen3-8b greedy, async, {label}, all prompts prefilled in one step",
                       spec=spec, synthetic=rate, async_scheduling=True, batch_queue=True,
                       max_num_batched_tokens=c * PROMPT_LEN)


def host_breakdown(bench: Bench) -> None:
    """Where an engine step's wall time goes at c = 1 and 32 (no spec, sync, graphs): mean ms per step
    in the scheduler, the runner's execute (host work up to the graph launch), the runner's sample
    (waits for the GPU, then host work), and the rest of the step loop (output processing)."""
    loaded = get_qwen8b()
    for c in (1, 32):
        generator = torch.Generator().manual_seed(c)
        prompts = [torch.randint(0, 500, (256,), generator=generator).tolist() for _ in range(c)]
        kv_gib = c * 400 * kv_bytes_per_token(loaded.config, torch.bfloat16) / 2**30 + 0.25
        llm = LLM(loaded, dtype="bfloat16", numerics="fast", max_num_seqs=c, max_model_len=400, block_size=BLOCK,
                  kv_cache_memory_gib=kv_gib, async_scheduling=False)
        core = llm.engine.core
        params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
        phases = Phases()
        phases.wrap(core.scheduler, "schedule", "scheduler.schedule")
        phases.wrap(core.scheduler, "update_from_output", "scheduler.update_from_output")
        phases.wrap(core.runner, "execute_model", "runner.execute_model (host, launches)")
        phases.wrap(core.runner, "sample_tokens", "runner.sample_tokens (GPU wait + host)")
        phases.wrap(core, "step", "engine step (all of the above)")
        t0 = time.perf_counter()
        llm.generate(prompts, params)
        wall = time.perf_counter() - t0
        phases.close()
        steps = core.runner.num_graph_steps + core.runner.num_eager_steps
        per_step = {k: round(v * 1e3 / 64, 3) for k, v in phases.host.items()}
        per_step["generate loop total"] = round(wall * 1e3 / 64, 3)
        bench.results.setdefault("host_breakdown_ms_per_step", {})[f"c={c}"] = per_step
        print(f"[bench] host breakdown c={c}: {per_step} ({steps} runner steps)", flush=True)
        core.shutdown()
        llm = None  # noqa: F841
        empty_cache()


def short_engine(loaded, c: int, **engine_args) -> tuple[LLM, list[list[int]]]:
    """An engine for c 16-token prompts (prefill next to nothing beside 64 decode steps), and the prompts."""
    llm = LLM(loaded, dtype="bfloat16", numerics="fast", max_num_seqs=c, max_model_len=128, block_size=BLOCK,
              kv_cache_memory_gib=0.5, **engine_args)
    return llm, [[3 + (i * 13 + j) % 400 for j in range(16)] for i in range(c)]


def device_trace():
    """torch.profiler over the device's kernels and copies; the dry run traces the CPU's ops instead, only
    to exercise the code."""
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CUDA if DEV == "cuda" else ProfilerActivity.CPU])


def device_spans(prof) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every traced device event, in start order."""
    kind = torch.autograd.DeviceType.CUDA if DEV == "cuda" else torch.autograd.DeviceType.CPU
    return sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events() if e.device_type == kind)


def idle_summary(spans: list[tuple[float, float, str]]) -> dict:
    """Busy time (the union of the spans) over the window, and the idle time after device-to-host copies.
    All idle time: gaps inside a step (between the kernels of one graph replay, between the replay and
    the sampler) and between steps. A step ends with the device-to-host copy of its sampled ids; the gap
    from the end of everything up to that copy to the next activity is idle time between consecutive
    steps, the issue's measure of overlap (with drafts, the drafts' copy ends a step and the verified
    ids' copy ends its verification: both gaps are the host turning a read around)."""
    busy, end, after, readbacks = 0.0, spans[0][0], 0.0, 0
    step_ended = False
    for start, stop, name in spans:
        if step_ended and start > end:
            after += start - end
        step_ended = False
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
        if "DtoH" in name:
            step_ended, readbacks = True, readbacks + 1
    window = spans[-1][1] - spans[0][0]
    return {"busy_ms": busy / 1e3, "window_ms": round(window / 1e3, 2), "idle_fraction": round(1 - busy / window, 4),
            "idle_after_readback_fraction": round(after / window, 4) if readbacks else None, "readbacks": readbacks}


def write_trace_summary(path: Path, summary: dict, prof) -> None:
    table = prof.key_averages().table(sort_by="cuda_time_total" if DEV == "cuda" else "cpu_time_total", row_limit=25)
    path.write_text(json.dumps(summary, indent=1) + "\n\n" + table)


def gpu_idle(bench: Bench) -> None:
    """GPU idle time between consecutive decode steps under async scheduling, from a profiler trace:
    1 - (union of kernel and copy intervals) / (first start to last end), over the last 48 of 64
    decode steps (16-token prompts, so prefill is negligible and the early steps are cut anyway)."""
    loaded = get_qwen8b()
    for c in (1, 8):
        llm, prompts = short_engine(loaded, c)
        params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
        llm.generate(prompts, params)  # warm-up: kernels compiled, graphs captured
        with device_trace() as prof:
            t0 = time.perf_counter()
            llm.generate(prompts, params)
            wall = time.perf_counter() - t0
        spans = device_spans(prof)
        cut = spans[0][0] + (spans[-1][1] - spans[0][0]) * 16 / 64  # drop the first 16 steps
        idle = idle_summary([sp for sp in spans if sp[0] >= cut])
        row = dict(section="gpu_idle", what="async, graphs, qwen3-8b greedy, 16 in / 64 out, last 48 steps", c=c,
                   idle_fraction=idle["idle_fraction"], idle_between_steps_fraction=idle["idle_after_readback_fraction"],
                   step_boundaries=idle["readbacks"], window_ms=idle["window_ms"],
                   gpu_busy_ms_per_step=round(idle["busy_ms"] / 48, 3), wall_ms_per_token=round(wall * 1e3 / 64, 3),
                   in_flight_steps=llm.engine.core.runner.num_in_flight_steps,
                   overlapped_launches=llm.engine.core.runner.num_overlapped_launches)
        bench.row(**row)
        write_trace_summary(bench.out / f"trace_summary_c{c}.txt", row, prof)
        llm.engine.core.shutdown()
        del llm
        empty_cache()


def spec_phases(core) -> Phases:
    """Wrappers on every phase of a step: the engine thread's scheduler, the runner thread's execute and
    sample, and inside sample the verification and (with a drafter) the drafter; the host waits on the
    device (the staging-copy events, and frames landing one step late: zero-bubble under async
    scheduling, a wait for the copy under sync) each under a "wait:" label."""
    runner = core.runner
    drafter = runner.drafter
    phases = Phases()
    phases.wrap(core.scheduler, "schedule", "scheduler.schedule")
    phases.wrap(core.scheduler, "update_from_output", "scheduler.update_from_output")
    phases.wrap(runner, "execute_model", "runner.execute_model")
    phases.wrap(runner, "sample_tokens", "runner.sample_tokens")
    graphs = runner.dispatcher
    if graphs.target is not None:
        phases.wrap(graphs.target, "run", "target verify graph (staging + replay)", stream=True)
        phases.wrap(graphs.target.buffers.copied, "synchronize", "wait: target staging copy (event)")
    else:  # the dry run: no graphs on the CPU
        phases.wrap(runner.model, "forward", "target forward (eager)", stream=True)
    phases.wrap(model_runner, "verify_rows", "verify_rows (sampler + rejection)", stream=True)
    # With the one-graph uniform step, the sampler's own graph and the drafter's eager passes serve only
    # the general steps (logprobs, a constraint), which do not occur here: their work is in the uniform graph.
    if graphs.sampler is not None and graphs.uniform is None:  # a synthetic rule replays in the sampler's graph
        phases.wrap(graphs.sampler, "run", "rejection sampler graph (fill + replay)", stream=True)
    elif runner.accept is not None:  # the dry run of a synthetic rule: it runs eagerly
        phases.wrap(runner, "accept", "synthetic accept (device)")
    # The host applies a step's verified ids, accepted counts and drafts when its frame lands: one step
    # late under async scheduling (zero-bubble), at once under sync; its host time holds any wait for
    # the copy.
    phases.wrap(runner.in_flight, "land", "wait: frames landing (ids, counts, drafts)")
    phases.wrap(runner.in_flight, "record", "frame record (host rows + device columns)")
    if graphs.uniform is not None:
        phases.wrap(graphs.uniform, "run", "uniform step graph (verify + drafter + frame)", stream=True)
    if drafter is None:
        return phases
    phases.wrap(drafter, "propose", "drafter.propose (all)", stream=True)
    phases.wrap(drafter.network, "forward", "drafter network.forward (eager pass 1; 2..k too when eager)", stream=True)
    if graphs.uniform is None:
        phases.wrap(drafter, "draft", "drafter passes 2..k (eager)", stream=True)
    draft_graphs = graphs.draft_graphs
    if draft_graphs is not None:
        phases.wrap(draft_graphs, "run_proposal", "drafter passes 2..k (graph)", stream=True)
        if graphs.uniform is None:
            phases.wrap(draft_graphs, "run_step", "drafter step graph (pass 1 + proposal)", stream=True)
        phases.wrap(draft_graphs.proposal_buffers.copied, "synchronize", "wait: drafter staging copy (event)")
    return phases


def host_split(phases: Phases, run: dict, steps: int) -> dict[str, float]:
    """Host ms per runner step of each wrapped phase (nested as the engine calls them), the engine
    thread's step calls and the generate loop around them (output processing)."""
    seconds = {**phases.host, "engine step calls (engine thread)": run["step_s"],
               "generate loop outside the step calls": run["wall_s"] - run["step_s"]}
    return {label: round(s * 1e3 / steps, 3) for label, s in seconds.items()}


def spec_profile(bench: Bench) -> None:
    """What an EAGLE k = 4 engine step (random head, SYNTHETIC acceptance 0.7, async scheduling with the
    batch queue, CUDA graphs, qwen3-8b fast numerics) spends its time on, at c = 1 and 8, 16-token
    prompts and 64 new tokens, after a warm-up generate. Three runs of the same generate: plain (the wall
    per step, untouched), instrumented (spec_phases: host ms per step per phase, the waits, the device
    stream's ms per step of the phases that launch work) and traced (device busy and idle, kernel time
    by kind, the profiler's table in trace_summary_spec_c{c}.txt).

    A step is a runner step (one execute_model: a verify forward, its verification, the drafter's
    proposal; the prefill step counts too). The row:
      wall_ms_per_step                 plain run's generate wall / runner steps; wall_ms_per_engine_step
                                       divides by the engine's step calls (the engine rows' definition,
                                       which also counts the batch queue's launch-only calls);
                                       wall_ms_per_step_instrumented: the same, instrumented (the cost of
                                       the wrappers and the wait probes)
      verify_graph_gpu_ms_per_replay,  the device stream's time of the target's verify graph (its staging
      verify_graph_gpu_ms_per_step,    copy and replay), of verify_rows (sampler, rejection), of
      sampler_gpu_ms_per_step,         drafter.propose (pass 1 eagerly over every fed row, passes
      drafter_gpu_ms_per_step          2..k from the drafter's graph): kernels and copies plus the gaps where the
                                       device waited for the phase's host launches; all of them in
                                       stream_ms_per_step
      wall_over_verify_graph           wall_ms_per_step / verify_graph_gpu_ms_per_replay
      host_ms_per_step                 host wall time inside each wrapped method, nested as the engine calls
                                       them (runner.sample_tokens holds verify_rows, drafter.propose
                                       and the landing of frames); the engine thread's
                                       step calls and the generate loop around them
      waits_ms_per_step                the host waiting on the device, by place; waits_total_ms_per_step
      gpu_busy_ms_per_step,            from the trace: the union of kernels and copies per step, the idle
      idle_fraction,                   share of the window, the idle share after device-to-host reads up to
      idle_after_readbacks_fraction,   the next device activity, kernel ms per step by kind
      kernel_ms_per_step_by_kind
      accepted_tokens_per_step         accepted drafts (of k = 4) per request and verify step
      tokens_per_step                  output tokens per runner step, all requests together"""
    loaded = get_qwen8b()
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    for c in (1, 8):
        llm, prompts = short_engine(loaded, c, speculative_config=SpeculativeConfig("eagle", 4),
                                    synthetic_acceptance_rate=0.7, async_scheduling=True)
        core = llm.engine.core
        runner, stats = core.runner, core.scheduler.spec_decoding_stats
        llm.generate(prompts, params)  # warm-up: kernels compiled, graphs captured

        def counted(run, runner=runner, stats=stats):
            before = (runner.num_steps, stats.num_drafts, stats.num_accepted_tokens, runner.drafter.num_graph_steps)
            out = run()
            after = (runner.num_steps, stats.num_drafts, stats.num_accepted_tokens, runner.drafter.num_graph_steps)
            return out, [b - a for a, b in zip(before, after, strict=True)]

        plain, (steps, drafts, accepted, _) = counted(lambda llm=llm, prompts=prompts: timed_generate(llm, prompts, params, None))
        phases = spec_phases(core)
        try:
            instrumented, (i_steps, _, _, drafter_graph_steps) = counted(
                lambda llm=llm, prompts=prompts: timed_generate(llm, prompts, params, None))
        finally:
            phases.close()
        # Every wrapped phase ran: a wrapper on a method the engine no longer calls would report 0 ms.
        missed = [label for label in phases.labels if phases.calls[label] == 0]
        if missed:
            raise RuntimeError(f"spec_profile: phases never called: {missed}")
        with device_trace() as prof:
            _, (t_steps, _, _, _) = counted(lambda llm=llm, prompts=prompts: llm.generate(prompts, params))
        spans = device_spans(prof)
        # The device's activity is traced from every thread; the dry run's CPU ops only from this one,
        # and the runner works on its own thread: there the trace figures stay empty.
        idle = idle_summary(spans) if spans else dict.fromkeys(("busy_ms", "window_ms", "idle_fraction",
                                                                "idle_after_readback_fraction", "readbacks"))
        kinds: dict[str, float] = defaultdict(float)
        for start, stop, name in spans:
            kinds[kernel_kind(name)] += (stop - start) / 1e3 / t_steps

        def per_step(ms: float, n: int = i_steps) -> float:
            return round(ms / n, 3)

        stream = {label: per_step(phases.stream_ms(label)) for label in phases.marks}
        split = host_split(phases, instrumented, i_steps)
        host = {label: ms for label, ms in split.items() if not label.startswith("wait:")}
        waits = {label: ms for label, ms in split.items() if label.startswith("wait:")}
        target = next(label for label in phases.marks if label.startswith("target"))
        target_per_call = phases.stream_ms(target) / phases.calls[target]
        wall_ms_per_step = plain["wall_s"] * 1e3 / steps
        row = dict(section="spec_profile",
                   what="qwen3-8b EAGLE k=4 random head, SYNTHETIC acceptance 0.7, async + batch queue, "
                        "16 in / 64 out",
                   c=c, cuda_graphs=runner.dispatcher.target is not None, async_scheduling=llm.engine.async_resolution.enabled,
                   batch_queue=core.max_concurrent_batches > 1, runner_steps=steps, engine_step_calls=plain["steps"],
                   accepted_tokens_per_step=round(accepted / max(drafts, 1), 3),
                   tokens_per_step=round(plain["tokens"] / steps, 3),
                   wall_ms_per_step=round(wall_ms_per_step, 3),
                   wall_ms_per_engine_step=round(plain["wall_s"] * 1e3 / plain["steps"], 3),
                   wall_ms_per_step_instrumented=per_step(instrumented["wall_s"] * 1e3),
                   verify_graph_gpu_ms_per_replay=round(target_per_call, 3),
                   verify_graph_gpu_ms_per_step=stream[target],
                   sampler_gpu_ms_per_step=stream["verify_rows (sampler + rejection)"],
                   drafter_gpu_ms_per_step=stream["drafter.propose (all)"],
                   wall_over_verify_graph=round(wall_ms_per_step / target_per_call, 3) if target_per_call else None,
                   host_ms_per_step=host, waits_ms_per_step=waits, waits_total_ms_per_step=round(sum(waits.values()), 3),
                   stream_ms_per_step=stream, calls=dict(phases.calls),
                   drafter_graph_steps=drafter_graph_steps,
                   gpu_busy_ms_per_step=idle["busy_ms"] and round(idle["busy_ms"] / t_steps, 3),
                   idle_fraction=idle["idle_fraction"],
                   idle_after_readbacks_fraction=idle["idle_after_readback_fraction"], readbacks=idle["readbacks"],
                   traced_steps=t_steps, window_ms=idle["window_ms"],
                   kernel_ms_per_step_by_kind={k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])})
        bench.row(**row)
        write_trace_summary(bench.out / f"trace_summary_spec_c{c}.txt", row, prof)
        core.shutdown()
        del llm, core, runner
        empty_cache()


HEAD_METHODS = ("eagle", "eagle3", "mtp", "dflash")


def graph_replay_us(runner, k: int) -> dict[str, float]:
    """Device microseconds of one replay of each CUDA graph a one-request step runs, replayed alone 200
    times after 20 (the static buffers hold the last step's inputs, so each replay redoes that step):
    the target's forward of 1 and of k + 1 tokens, the greedy rejection sampler and the drafter's step.
    It replays each graph set's captured key alone (GraphSet.run): no engine path replays a graph without
    filling it. {} on the CPU."""
    d = runner.dispatcher
    if DEV != "cuda" or d.target is None:
        return {}
    graphs = {f"target {t} tokens": (d.target.graphs, t) for t in d.target.graphs.stats.keys if t in (1, k + 1)}
    if d.sampler is not None:
        graphs["rejection sampler (greedy)"] = (d.sampler.graphs, next(
            key for key in d.sampler.graphs.stats.keys if key.padded == 1 and key.greedy and not key.masked))
    if d.draft_graphs is not None:
        graphs["drafter step (pass 1 + proposal)"] = (d.draft_graphs.steps, 1)
    timings = {}
    for name, (graph_set, key) in graphs.items():
        for _ in range(20):
            graph_set.run(key)
        start = mark()
        for _ in range(200):
            graph_set.run(key)
        end = mark()
        sync()
        timings[name] = round(marks_ms(start, end) * 1e3 / 200, 1)
    return timings


def heads_profile(bench: Bench) -> None:
    """The embedded SmolLM2 (fast numerics, async, CUDA graphs) with spec off and each shipped head at
    k = 4, c = 1 and 8, 2·c chat prompts (the oracle's varied texts) of 64 new tokens, after a warm-up
    generate: the wall per runner step (a plain run); the host ms per step of each phase of the step and
    the device stream's ms of those that launch work (an instrumented run, spec_phases: where a step
    spends the host time its device time does not cover); the device's busy time and kernels per step,
    by kind (a traced run); each captured graph's device time replayed alone (graph_replay_us); and the
    mean acceptance length. busy(head) / busy(off) / acceptance length is
    the floor under a head's TPOT ratio to spec off where the host keeps up: what a spec step of a
    small target costs on the device, in kernels more than in bytes. The dry run: tiny-llama with a
    randomly initialised eagle head, on the CPU."""
    model, methods = ("smollm2", ("off", *HEAD_METHODS)) if DEV == "cuda" else ("tiny-llama", ("off", "eagle"))
    params = SamplingParams(temperature=0.0, max_tokens=64 if DEV == "cuda" else 8, ignore_eos=True)
    for method in methods:
        for c in (1, 8):
            spec = None if method == "off" else SpeculativeConfig(method, 4)
            llm = LLM(model, numerics="fast", device=DEV, max_num_seqs=c, max_model_len=256, speculative_config=spec)
            tok = llm.tokenizer
            prompts = [tok.encode(tok.apply_chat_template([ChatMessage("user", t)]), add_special_tokens=False)
                       if tok.chat_template is not None else tok.encode(t) for t in TEXT_PROMPTS[: 2 * c]]
            prompts = [prompts[i % len(prompts)] for i in range(2 * c)]
            core = llm.engine.core
            runner, stats = core.runner, core.scheduler.spec_decoding_stats
            llm.generate(prompts, params)  # warm-up: kernels compiled, graphs captured
            before = (runner.num_steps, stats.num_drafts, stats.num_accepted_tokens, runner.num_eager_steps)
            plain = timed_generate(llm, prompts, params, None)
            steps, drafts, accepted, eager = (
                b - a for a, b in zip(before, (runner.num_steps, stats.num_drafts, stats.num_accepted_tokens,
                                               runner.num_eager_steps), strict=True))
            phases = spec_phases(core)
            try:
                n0 = runner.num_steps
                instrumented = timed_generate(llm, prompts, params, None)
                i_steps = runner.num_steps - n0
            finally:
                phases.close()
            with device_trace() as prof:
                n0 = runner.num_steps
                llm.generate(prompts, params)
                t_steps = runner.num_steps - n0
            spans = device_spans(prof)
            busy = idle_summary(spans)["busy_ms"] if spans else None
            kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
            for start, stop, name in spans:
                kinds[kernel_kind(name)][0] += (stop - start) / 1e3 / t_steps
                kinds[kernel_kind(name)][1] += 1 / t_steps
            bench.row(section="heads_profile", what=f"{model} fast, {method} k=4, async, graphs, {params.max_tokens} out", c=c,
                      method=method, requests=len(prompts), runner_steps=steps, eager_steps=eager,
                      wall_ms_per_step=round(plain["wall_s"] * 1e3 / steps, 3), tpot_ms=round(plain["tpot_ms"], 3),
                      tokens_per_step=round(plain["tokens"] / steps, 3),
                      acceptance_length=round(1 + accepted / drafts, 3) if drafts else None,
                      gpu_busy_ms_per_step=busy and round(busy / t_steps, 3),
                      kernels_per_step=round(len(spans) / t_steps, 1),
                      kernel_ms_and_count_per_step_by_kind={k: [round(ms, 3), round(n, 1)] for k, (ms, n) in kinds.items()},
                      graph_replay_us=graph_replay_us(runner, 4),
                      wall_ms_per_step_instrumented=round(instrumented["wall_s"] * 1e3 / i_steps, 3),
                      host_ms_per_step=host_split(phases, instrumented, i_steps),
                      stream_ms_per_step={label: round(phases.stream_ms(label) / i_steps, 3) for label in phases.marks})
            write_trace_summary(bench.out / f"trace_summary_heads_{method}_c{c}.txt", {"method": method, "c": c}, prof)
            core.shutdown()
            del llm, core, runner
            empty_cache()


def hf_peer(bench: Bench) -> None:
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from refengine.model.weights import hf_state_dict

    loaded = get_qwen8b()
    cfg = loaded.config
    hf_cfg = Qwen3Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                         num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                         num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
                         rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_position_embeddings,
                         tie_word_embeddings=cfg.tie_word_embeddings)
    rope = getattr(hf_cfg, "rope_parameters", None)
    if isinstance(rope, dict):
        rope["rope_theta"] = cfg.rope_theta
    hf_cfg._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(DEV):
            hf = Qwen3ForCausalLM(hf_cfg)
    finally:
        torch.set_default_dtype(previous)
    missing, unexpected = hf.load_state_dict(hf_state_dict(loaded.model), strict=False)
    hf.eval()
    gc.collect()
    info = {"transformers": transformers.__version__, "missing": [m for m in missing if "rotary" not in m][:5],
            "unexpected": list(unexpected)[:5]}
    # Same weights check: last-position logits of a 32-token prompt, HF vs this engine's model.
    prompt = torch.randint(0, 500, (1, 32), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        hf_logits = hf(prompt.to(DEV)).logits[0, -1].float()
        cache = KVCache.allocate(cfg, 4, BLOCK, dtype=torch.bfloat16, device=DEV)
        meta = build_attention_metadata([0], [32], [[0, 1]], BLOCK)
        out = loaded.model(prompt[0].to(DEV), torch.arange(32).to(DEV), meta.to(DEV), cache)
        ours = loaded.model.compute_logits(out.hidden_states[-1:])[0]
    info["logits_rel_diff"] = float((hf_logits - ours).norm() / hf_logits.norm())
    info["same_argmax"] = bool(hf_logits.argmax() == ours.argmax())
    bench.results["hf"] = info
    for bs, new in ((1, 32), (8, 32)):
        ids = torch.randint(0, 500, (bs, PROMPT_LEN), generator=torch.Generator().manual_seed(bs)).to(DEV)
        mask = torch.ones_like(ids)

        def gen(n, ids=ids, mask=mask):
            with torch.inference_mode():
                return hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                   do_sample=False, pad_token_id=0)

        gen(2)
        sync()
        t0 = time.perf_counter()
        gen(1)
        sync()
        t1 = time.perf_counter()
        gen(1 + new)
        sync()
        t2 = time.perf_counter()
        tpot = ((t2 - t1) - (t1 - t0)) / new * 1e3
        floor = floor_ms(loaded, bs, PROMPT_LEN + new // 2)
        bench.row(section="hf", what=f"HF transformers {transformers.__version__} generate, sdpa, dynamic cache",
                  c=bs, prompt=PROMPT_LEN, output=new, attention="sdpa (HF)", cuda_graphs=False,
                  tpot_ms=round(tpot, 3), output_tok_s=round(bs * 1e3 / tpot, 1), floor_ms=round(floor, 3),
                  roofline=round(floor / tpot, 3))
    hf = None  # noqa: F841
    gc.collect()


def oracle(bench: Bench, backend: str) -> None:
    from refengine.oracle.arms import Arm
    from refengine.oracle.command import derive_bad_words
    from refengine.oracle.judge import judge
    from refengine.oracle.prompts import text_prompts
    from refengine.oracle.run import Workload, run_arm

    Qwen8b.loaded = None
    Qwen8b.cache = None
    empty_cache()
    loaded = build_random_model("qwen3-0.6b", seed=0, dtype=torch.float32, numerics=Numerics.BATCH_INVARIANT,
                                device=DEV, **OVERRIDES)
    prompts = text_prompts(loaded.tokenizer, 4)
    verdicts = []
    before = dict(attention.ATTENTION_CALLS)
    t0 = time.perf_counter()
    for c in (1, 4):
        for temperature in (0.0, 0.8):
            workload = Workload(tuple(map(tuple, prompts)), 12, c, temperature, 0, 3)
            base = run_arm(loaded, Arm("sync", None, False, False, False), workload, BLOCK, attention_backend=backend)
            workload = Workload(workload.prompts, 12, c, temperature, 0, 3, derive_bad_words(base))
            arms = [Arm(front, method, False, False, False)
                    for method in (None, "eagle") for front in ("sync", "async-d1", "async-d2")]
            results = {arm: run_arm(loaded, arm, workload, BLOCK, attention_backend=backend) for arm in arms}
            results.setdefault(Arm("sync", None, False, False, False), base)
            for arm in arms:
                # Greedy and seeded alike: every arm against the no-spec baseline, token for token.
                twin = results.get(arm.sync_twin()) if arm.method is not None else None
                v = judge(results[arm], results[arm.baseline()], twin)
                verdicts.append({"c": c, "temperature": temperature, "arm": arm.name, "vs": v.reference,
                                 "ok": v.ok, "verdict": v.label, "divergence": repr(v.divergence),
                                 "step_mismatch": v.step_mismatch,
                                 "drafts": results[arm].num_draft_tokens, "accepted": results[arm].num_accepted_tokens})
    failures = [v for v in verdicts if not v["ok"]]
    bench.results[f"oracle_{backend}"] = {
        "model": "random:qwen3-0.6b float32 batch_invariant on cuda",
        "covers": "fronts sync / async-d1 / async-d2 x methods none, eagle (random head, k=3) x c=1,4 x greedy and "
                  "seeded temperature 0.8; 4 text prompts x 12 tokens; no chunked / preempt / bad_words arms",
        "attention": calls_delta(before), "seconds": round(time.perf_counter() - t0, 1),
        "arms_compared": len(verdicts), "failures": failures, "verdicts": verdicts,
    }
    bench.row(section="oracle", what=f"oracle qwen3-0.6b fp32 batch-invariant, attention={backend}",
              attention=calls_delta(before), compared=len(verdicts), mismatches=len(failures))


def print_table(bench: Bench) -> None:
    print("\n| section | what | c | attention | graphs | ms (TPOT or step) | tok/s | floor ms | roofline |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in bench.results["rows"]:
        ms = r.get("tpot_ms", r.get("ms"))
        if "itl_median_ms" in r:
            ms = f"{ms} (median ITL {r['itl_median_ms']})"
        extra = f" {r.get('numerics', '')}{'' if r.get('fused_ops', True) else ' unfused'}" if r["section"] == "steps" else ""
        if r.get("adaptive"):  # the K adaptive verification chose: mean, and request-steps at K = 0..k
            extra = f" (mean K {r['mean_k']}, K = 0..k: {r['chosen_k']}, acceptance {r['acceptance']})"
        print(f"| {r['section']} | {r['what']}{extra} | "
              f"{r.get('c', '')} | {r.get('attention', '')} | {r.get('cuda_graphs', '')} | {ms if ms is not None else ''} | "
              f"{r.get('output_tok_s', '')} | {r.get('floor_ms', '')} | {r.get('roofline', r.get('mismatches', ''))} |")
    print({k: v for k, v in bench.results["sections"].items()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=420)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--only", default="", help="comma-separated section names")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: check the script, time nothing real")
    args = parser.parse_args()
    if args.dry_run:
        global DEV, PROMPT_LEN, OUTPUT_LEN, MID_CONTEXT, ADAPTIVE_C
        DEV, PROMPT_LEN, OUTPUT_LEN, ADAPTIVE_C = "cpu", 40, 8, (1, 4)
        MID_CONTEXT = PROMPT_LEN + OUTPUT_LEN // 2
        OVERRIDES.update(DRY_OVERRIDES)
    args.out.mkdir(parents=True, exist_ok=True)
    bench = Bench(args.out, args.budget_s, args.commit)
    import triton

    bench.results["versions"] = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__}
    bench.results["dry_run"] = args.dry_run
    plan = [
        ("bandwidth", lambda: bandwidth(bench), 5),
        ("steps", lambda: model_steps(bench), 60),
        ("profile", lambda: profile_step(bench), 15),
        ("engine", lambda: engine_section(bench), 60),
        ("gpu_idle", lambda: gpu_idle(bench), 30),
        ("hf", lambda: hf_peer(bench), 40),
        ("host", lambda: host_breakdown(bench), 20),
        ("async_ab", lambda: async_ab(bench), 50),
        ("adaptive_k", lambda: adaptive_k(bench), 120),
        ("spec_profile", lambda: spec_profile(bench), 30),
        ("heads_profile", lambda: heads_profile(bench), 120),
        ("oracle_triton", lambda: oracle(bench, "auto"), 60),
        ("oracle_reference", lambda: oracle(bench, "reference"), 60),
    ]
    only = {s for s in args.only.split(",") if s}
    for name, fn, needs in plan:
        if not only or name in only:
            bench.section(name, fn, needs_s=needs)
    print_table(bench)
    bench.save()


if __name__ == "__main__":
    main()
