"""Result directories built from fixture rungs, written the way `ladder run` writes them (RunStore, to_dict)."""

import copy
import json
from pathlib import Path

from ladder.audit import Audit
from ladder.config import ENGINE_KEYS
from ladder.metrics import DEFINITIONS, LengthStats, RungStats, SpecAcceptance, Summary
from ladder.rung import RungNotRun, RungOk, RungResult, RungVoid
from ladder.store import RunStore

PCTS = (50.0, 90.0, 99.0)

WORKLOAD = {
    "prompt_hash": "h-all", "rung_prompt_hashes": {"1": "h1" * 32, "2": "h2" * 32, "4": "h4" * 32},
    "seed": 0, "input_len": 128, "output_len": 64,
    "sampling": {"temperature": 0.0, "ignore_eos": True, "max_tokens": 64},
    "endpoint_kind": "openai-chat", "prompt_sizing": {"method": "probe"}, "continuous_usage_stats": True,
    "output_count": "usage",
}

REFENGINE = {"engine": "refengine", "engine_version": None, "device": "cpu", "weights": "smol.gguf", "weight_format": "Q4_1",
             "dtype": "float32", "kv_dtype": "float32", "numerics": "batch_invariant", "spec_method": "none",
             "spec_k": 0, "async_scheduling": "on", "max_model_len": 2048, "max_num_seqs": 8}


def summary(mean: float) -> Summary:
    return Summary(mean=mean, percentiles={"p50": mean, "p90": mean * 1.2, "p99": mean * 1.5})


def ok(c: int, tput: float, ttft: float = 100.0, tpot: float = 20.0, input_tokens: int = 128,
       output_tokens: int = 64, spec: SpecAcceptance | None = None, cpu_pct: float = 5.0,
       loop_lag_ms: float = 1.0, output_max: int | None = None, peak: int | None = None,
       input_max: int | None = None) -> RungOk:
    """An OK rung; lengths span input_tokens..input_max and output_tokens..output_max (default: all equal)."""
    top = output_tokens if output_max is None else output_max
    input_top = input_tokens if input_max is None else input_max
    stats = RungStats(
        num_requests=4 * c, duration_s=10.0, request_throughput=tput / output_tokens, output_throughput=tput,
        total_throughput=tput * 3, per_user_tok_s=1000.0 / tpot,
        input_tokens=LengthStats(input_tokens, (input_tokens + input_top) / 2, input_top),
        output_tokens=LengthStats(output_tokens, (output_tokens + top) / 2, top),
        ttft_ms=summary(ttft), e2e_ms=summary(ttft + 63 * tpot), tpot_ms=summary(tpot),
        chunk_gap_ms=summary(tpot), itl_token_ms=None, tokens_per_chunk=summary(1.0))
    return RungOk(c, 5 * c, f"h{c}" * 32, stats, Audit(cpu_pct, loop_lag_ms, 0.5), spec, num_measured=4 * c,
                  peak_in_flight=c if peak is None else peak)


def void(c: int, reason: str = "http_error", error: str = "http_error: HTTP 500: boom") -> RungVoid:
    return RungVoid(c, num_ok=1, num_failed=7, reason=reason, errors=(error,), prompt_hash=f"h{c}" * 32)


def not_run(c: int, reason: str = "engine_dead: the server process exited with code 1") -> RungNotRun:
    return RungNotRun(c, reason)


def write_run(root: Path, label: str, rungs: list[RungResult], engine: dict | None = None,
              workload: dict | None = None, sources: str = "server") -> Path:
    out = root / label
    store = RunStore(out)
    eng = {k: (engine or REFENGINE).get(k) for k in ENGINE_KEYS}
    store.write_manifest({
        "tool": "ladder", "label": label, "engine": eng,
        "engine_sources": {k: sources if v is not None else None for k, v in eng.items()},
        "workload": copy.deepcopy(workload or WORKLOAD), "definitions": DEFINITIONS,
        "flags": {"prompts_per_rung": None, "prompts_per_concurrency": 4, "percentiles": list(PCTS)},
    })
    store.write_rungs(rungs)
    return out


def load(path: Path) -> dict:
    return json.loads(path.read_text())
