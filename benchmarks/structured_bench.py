"""reports/structured.md: structured output on the embedded SmolLM2 on the CPU, eagle k=3 with the trained
head, async scheduling: per-token mask time, drafts the grammar cut, acceptance and TPOT with and without a
JSON schema, from one run (the two passes alternate prompt by prompt, so machine load falls on both).
A benchmark, not a test: it writes numbers (the summary as JSON on stdout, the report with --out).

    python benchmarks/structured_bench.py [--prompts 6] [--out reports/structured.md]
"""

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from ladder.host import provenance
from ladder.own_version import build
from refengine.engine.llm import LLM
from refengine.sampling_params import SamplingParams, StructuredOutputsParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.tokenizer import ChatMessage

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "population_millions": {"type": "number", "minimum": 0},
        "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3},
        "capital": {"type": "boolean"},
    },
    "required": ["name", "country", "population_millions", "landmarks", "capital"],
    "additionalProperties": False,
}
CITIES = ["Paris", "Tokyo", "Nairobi", "Lima", "Oslo", "Hanoi", "Toronto", "Cairo"]
MAX_TOKENS = 96


def prompt(tokenizer, city: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [ChatMessage("user", f"Describe the city of {city} as a JSON object with its name, country, "
                             "population in millions, up to three landmarks, and whether it is a capital.")]
    )
    return tokenizer.encode(text, add_special_tokens=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    start = time.perf_counter()
    llm = LLM("smollm2", speculative_config=SpeculativeConfig("eagle", 3), max_num_seqs=1, max_model_len=512,
              num_blocks=64)
    core = llm.engine.core
    manager = llm.engine.structured_output_manager
    timings: list[float] = []  # seconds per bitmask row
    bitmask = manager.grammar_bitmask

    def timed_bitmask(structured_requests, spec_decode_tokens):
        start = time.perf_counter()
        out = bitmask(structured_requests, spec_decode_tokens)
        if out is not None:
            timings.extend([(time.perf_counter() - start) / len(out.grammar_bitmask)] * len(out.grammar_bitmask))
        return out

    manager.grammar_bitmask = timed_bitmask
    # When each step's tokens reached the engine's output: TPOT is the time from the first token to the
    # last over the tokens after the first (prefill and the grammar's compile are not in it).
    arrivals: list[tuple[float, int]] = []
    front = "step_with_batch_queue" if core.max_concurrent_batches > 1 else "step"
    step = getattr(core, front)

    def timed_step():
        out = step()
        if out is not None and (n := sum(len(o.new_token_ids) for o in out.outputs)):
            arrivals.append((time.perf_counter(), n))
        return out

    setattr(core, front, timed_step)
    passes = {
        "grammar": SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, structured_outputs=StructuredOutputsParams(json=SCHEMA)),
        "free": SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
    }
    results = {name: {"tpot": [], "drafts": 0, "accepted": 0, "tokens": 0, "valid": 0, "stop": 0} for name in passes}
    for city in CITIES[: args.prompts]:
        ids = prompt(llm.tokenizer, city)
        for name, params in passes.items():
            stats = core.scheduler.spec_decoding_stats
            drafts, accepted = stats.num_draft_tokens, stats.num_accepted_tokens
            arrivals.clear()
            (out,) = llm.generate([ids], params)
            r = results[name]
            if len(arrivals) > 1:
                r["tpot"].append((arrivals[-1][0] - arrivals[0][0]) / sum(n for _, n in arrivals[1:]))
            r["drafts"] += stats.num_draft_tokens - drafts
            r["accepted"] += stats.num_accepted_tokens - accepted
            r["tokens"] += len(out.token_ids)
            r["stop"] += out.finish_reason == "stop"
            if name == "grammar":
                try:
                    json.loads(out.text)
                    r["valid"] += 1
                except ValueError:
                    pass
    cut = core.scheduler.num_grammar_cut_drafts
    mask_us = sorted(t * 1e6 for t in timings)
    summary = {
        "context": {
            "build": build().describe(), "machine": f"{platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)",
            "model": "embedded SmolLM2-135M-Instruct (Q4_1 -> fp32), batch-invariant", "spec": "eagle k=3, trained head",
            "async_scheduling": llm.engine.async_resolution.enabled, "prompts": args.prompts, "max_tokens": MAX_TOKENS,
            "schema": SCHEMA,
        },
        "mask_us_per_row": {"median": statistics.median(mask_us), "p90": mask_us[int(0.9 * (len(mask_us) - 1))],
                            "rows": len(mask_us)},
        "drafts_cut_by_grammar": cut,
        "passes": {
            name: {
                "acceptance": r["accepted"] / r["drafts"] if r["drafts"] else None,
                "drafts_verified": r["drafts"], "accepted": r["accepted"], "output_tokens": r["tokens"],
                "tpot_ms_median": 1e3 * statistics.median(r["tpot"]), "tpot_ms_mean": 1e3 * statistics.mean(r["tpot"]), "finished_by_stop": r["stop"],
                **({"valid_json": r["valid"]} if name == "grammar" else {}),
            }
            for name, r in results.items()
        },
    }
    print(json.dumps(summary, indent=2))
    if args.out is not None:
        args.out.write_text(report(summary, time.perf_counter() - start))
        print(f"wrote {args.out}")


def report(summary: dict, wall_s: float) -> str:
    g, f = summary["passes"]["grammar"], summary["passes"]["free"]
    n, mask, cut = summary["context"]["prompts"], summary["mask_us_per_row"], summary["drafts_cut_by_grammar"]
    proposed = g["drafts_verified"] + cut

    def pct(part: int, whole: int) -> str:
        return f"{100 * part / whole:.1f}%" if whole else "-"

    return "\n".join([
        "# Structured output on SmolLM2 with eagle", "",
        provenance("structured-report"),
        f"One torch thread; the embedded SmolLM2-135M-Instruct (Q4_1 dequantised to fp32, batch-invariant numerics), "
        f"eagle with k = 3 and the shipped trained head, async scheduling (depth 2), one request at a time, greedy, "
        f"max_tokens {MAX_TOKENS}. {n} chat prompts (\"Describe the city of X as a JSON object with ...\"), each run "
        "twice in one process, alternating: once constrained by a JSON schema (name, country, population, up to three "
        "landmarks, capital: 5 required properties, bounded strings), once free. "
        f"{int(wall_s // 60)} min {int(wall_s % 60)} s wall.", "",
        "| | with the JSON schema | free |",
        "|---|---|---|",
        f"| output tokens | {g['output_tokens']:,} | {f['output_tokens']:,} |",
        f"| finished by `stop` (grammar end or eos) | {g['finished_by_stop']} of {n} | {f['finished_by_stop']} of {n} |",
        f"| valid JSON | {g['valid_json']} of {n} (a request that reaches max_tokens before its grammar ends is cut short) | - |",
        f"| drafts verified | {g['drafts_verified']:,} | {f['drafts_verified']:,} |",
        f"| drafts accepted | {g['accepted']:,} ({pct(g['accepted'], g['drafts_verified'])}) "
        f"| {f['accepted']:,} ({pct(f['accepted'], f['drafts_verified'])}) |",
        f"| drafts cut by the grammar before verification | {cut:,} | - |",
        "| TPOT, first token to last (prefill and the grammar's compile left out), median over the prompts "
        f"| {g['tpot_ms_median']:.0f} ms | {f['tpot_ms_median']:.0f} ms |",
        f"| the same, mean | {g['tpot_ms_mean']:.0f} ms | {f['tpot_ms_mean']:.0f} ms |", "",
        "Mask time, per verified row (the tentative advance through the row's drafts, the mask, the rollback, and the "
        f"masked-row count, divided over the step's rows): median {mask['median']:.0f} µs, p90 {mask['p90']:.0f} µs "
        f"over {mask['rows']:,} rows, {pct(mask['median'] / 1e3, g['tpot_ms_median'])} of the schema pass's median TPOT.",
        "",
        f"The grammar forces compact JSON, which the head was not trained on: {cut:,} of its {proposed:,} drafts "
        f"({pct(cut, proposed)}) were forbidden by the grammar and cut before verification. The free pass's acceptance "
        "is the head on this text, without a grammar (`reports/acceptance.md` has the heads on held-out ShareGPT).",
        "",
        "The oracle's structured arms (every method and front, token for token against the sync no-spec structured "
        "baseline) are in `reports/oracle.md`.", ""])


if __name__ == "__main__":
    main()
