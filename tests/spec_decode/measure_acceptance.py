"""Measures acceptance per speculative method on SmolLM2 and prints the table of reports/acceptance-untrained.md.

    OMP_NUM_THREADS=1 .venv/bin/python tests/spec_decode/measure_acceptance.py > /tmp/acceptance.md

Greedy, a fixed prompt set, every method at k = 2 and 4. Heads other than the self-draft and ngram are
randomly initialised (no trained SmolLM2 heads exist yet): their rows show what a random head gets,
which is the honest baseline the trained heads must beat. Each run is also checked against spec-off
output (lossless).
"""

import os
import platform
import subprocess

import torch

from refengine.engine.llm import LLM
from refengine.model.loader import load_model
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5, 6,",
    "Once upon a time, in a small village,",
]
MAX_TOKENS = 32
MAX_NUM_SEQS = 4
METHODS = [
    ("ngram", dict(method="ngram", prompt_lookup_min=1, prompt_lookup_max=3)),
    ("self-draft, 8 of 30 layers", dict(method="draft_model", num_draft_layers=8)),
    ("self-draft, 16 of 30 layers", dict(method="draft_model", num_draft_layers=16)),
    ("eagle (random init)", dict(method="eagle")),
    ("eagle3 (random init)", dict(method="eagle3")),
    ("mtp (random init)", dict(method="mtp")),
    ("dflash (random init)", dict(method="dflash")),
]
ENGINE = dict(num_blocks=128, block_size=16, max_model_len=256, max_num_seqs=MAX_NUM_SEQS)


def main() -> None:
    target = load_model("smollm2")
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    baseline = [o.token_ids for o in LLM(target, **ENGINE).generate(PROMPTS, greedy)]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"SmolLM2-135M-Instruct (embedded GGUF, Q4_1 dequantised to float32, batch-invariant numerics); "
        f"{len(PROMPTS)} prompts x {MAX_TOKENS} tokens, greedy, max_num_seqs={MAX_NUM_SEQS}, block_size=16.\n"
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; commit {commit}.\n"
    )
    print(
        "| method | k | scheduling | drafts | draft tokens | accepted | acceptance rate "
        "| mean acceptance length | accepted per position | lossless |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, options in METHODS:
        for k in (2, 4):
            spec = SpeculativeConfig(num_speculative_tokens=k, **options)
            llm = LLM(target, **ENGINE, speculative_config=spec)
            outs = llm.generate(PROMPTS, greedy)
            stats = llm.engine.core.scheduler.spec_decoding_stats
            rate = stats.num_accepted_tokens / stats.num_draft_tokens if stats.num_draft_tokens else 0.0
            # Tokens per verify step, the accepted drafts plus the target's own token.
            mean_len = 1 + stats.num_accepted_tokens / stats.num_drafts if stats.num_drafts else 1.0
            mode = "async" if llm.engine.async_resolution.enabled else "sync"
            lossless = [o.token_ids for o in outs] == baseline
            print(
                f"| {name} | {k} | {mode} | {stats.num_drafts} | {stats.num_draft_tokens} | {stats.num_accepted_tokens} "
                f"| {rate:.1%} | {mean_len:.2f} | {stats.num_accepted_tokens_per_pos} | {lossless} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
