"""The acceptance report of the shipped heads: engine runs on held-out prompts, next to the
self-draft and ngram.

    python -m refengine.train.report --out reports/acceptance.md
"""

import json
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import click
import torch

from refengine.engine.llm import LLM
from refengine.heads import shipped_head_path
from refengine.model.loader import LoadedModel, load_model
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.train.data import encode_prompt
from refengine.train.evaluate import Acceptance, engine_acceptance
from refengine.train.prompts import build_prompts
from refengine.train.trainer import METHODS

EVAL_SEED = 2
KS = (2, 4, 8)
SELF_DRAFT_LAYERS = 6
NOTES_MARKER = "<!-- notes: kept when the tables are regenerated -->"


@dataclass(frozen=True)
class Row:
    name: str
    k: int
    acceptance: Acceptance
    seconds: float


def drafters(target: str, heads: dict[str, Path]) -> dict[str, dict]:
    configs = {m: {"method": m, "model": str(path)} for m, path in heads.items()}
    configs[f"draft_model ({SELF_DRAFT_LAYERS} layers)"] = {
        "method": "draft_model",
        "num_draft_layers": SELF_DRAFT_LAYERS,
    }
    configs["ngram"] = {"method": "ngram"}
    return configs


def measure(
    loaded: LoadedModel, configs: dict[str, dict], num_prompts: int, max_tokens: int, log=print
) -> list[Row]:
    prompts = [encode_prompt(loaded, p) for p in build_prompts(num_prompts, EVAL_SEED, held_out=True)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    rows = []
    for name, config in configs.items():
        for k in KS:
            spec = SpeculativeConfig.from_dict({**config, "num_speculative_tokens": k})
            start = time.monotonic()
            llm = LLM(loaded, speculative_config=spec, max_num_seqs=len(prompts), max_model_len=1024)
            acceptance = engine_acceptance(llm, prompts, params)
            rows.append(Row(name, k, acceptance, time.monotonic() - start))
            log(
                f"{name} k={k}: mean accepted length {acceptance.mean_accepted_length:.2f}, per position "
                + " ".join(f"{a:.2f}" for a in acceptance.per_position)
                + f" ({acceptance.num_steps} steps, {rows[-1].seconds:.0f}s)"
            )
    return rows


def markdown(rows: list[Row], heads: dict[str, Path], num_prompts: int, max_tokens: int) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "# Acceptance of the shipped SmolLM2 drafter heads",
        "",
        f"Engine runs (greedy, fast numerics, one batch of {num_prompts}) on {num_prompts} held-out prompts "
        f"(`build_prompts({num_prompts}, seed={EVAL_SEED}, held_out=True)`: subjects, coding tasks, modules and "
        f"documentation topics no training prompt uses), {max_tokens} new tokens each. Acceptance at draft "
        "position i is the share of verify steps whose i-th draft was accepted; mean accepted length is "
        "1 + accepted drafts per verify step (vLLM's definition, the bonus token included).",
        f"Commit {commit}, torch {torch.__version__}, Python {platform.python_version()}, {torch.get_num_threads()} threads.",
        "",
        "## Mean accepted length",
        "",
        "| drafter | " + " | ".join(f"k = {k}" for k in KS) + " |",
        "|---|" + "---|" * len(KS),
    ]
    names = list(dict.fromkeys(r.name for r in rows))
    by = {(r.name, r.k): r for r in rows}
    for name in names:
        cells = [f"{by[name, k].acceptance.mean_accepted_length:.2f}" for k in KS if (name, k) in by]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Tokens per target step",
        "",
        "Generated tokens per target forward, steps that carried no drafts included (ngram drafts only where its "
        "lookup matches, so its per-step rows above cover fewer steps than a head's). A dash: measured before this "
        "column was recorded; rerun that drafter to fill it.",
        "",
        "| drafter | " + " | ".join(f"k = {k}" for k in KS) + " |",
        "|---|" + "---|" * len(KS),
    ]
    for name in names:
        cells = [
            "—"
            if by[name, k].acceptance.tokens_per_step is None
            else f"{by[name, k].acceptance.tokens_per_step:.2f}"
            for k in KS
            if (name, k) in by
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Acceptance per draft position", ""]
    width = max(KS)
    lines += ["| drafter | k | steps | " + " | ".join(str(i + 1) for i in range(width)) + " |"]
    lines += ["|---|---|---|" + "---|" * width]
    for r in rows:
        cells = [f"{a:.2f}" for a in r.acceptance.per_position] + [""] * (width - r.k)
        lines.append(f"| {r.name} | {r.k} | {r.acceptance.num_steps} | " + " | ".join(cells) + " |")
    lines += ["", "## How the heads were made", ""]
    for method, path in heads.items():
        config = json.loads((path / "config.json").read_text())
        training = config.get("training", {})
        size = sum(f.stat().st_size for f in path.glob("*.safetensors")) / 2**20
        lines += [
            f"### {method}",
            "",
            f"`{training.get('command', '?')}`",
            "",
            f"- {size:.1f} MiB fp16, {config.get('num_hidden_layers')} layer(s); trained {training.get('train_seconds')} s "
            f"on {training.get('data', {}).get('positions')} positions",
        ]
        if "held_out_offline" in training:
            offline = training["held_out_offline"]
            lengths = ", ".join(f"k={k}: {v}" for k, v in offline["mean_accepted_length"].items())
            lines.append(
                f"- offline held-out check at the end of training ({offline['anchors']} anchors): per position "
                + " ".join(f"{a:.2f}" for a in offline["per_position"])
                + f"; mean accepted length {lengths}"
            )
        lines.append("")
    return "\n".join(lines)


def load_rows(path: Path) -> list[Row]:
    if not path.is_file():
        return []
    return [
        Row(
            r["name"],
            r["k"],
            Acceptance(
                r["num_steps"], tuple(r["per_position"]), r["mean_accepted_length"], r.get("tokens_per_step")
            ),
            r["seconds"],
        )
        for r in json.loads(path.read_text())
    ]


def save_rows(path: Path, rows: list[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [
        {
            "name": r.name,
            "k": r.k,
            "num_steps": r.acceptance.num_steps,
            "per_position": list(r.acceptance.per_position),
            "mean_accepted_length": r.acceptance.mean_accepted_length,
            "tokens_per_step": r.acceptance.tokens_per_step,
            "seconds": r.seconds,
        }
        for r in rows
    ]
    path.write_text(json.dumps(records, indent=1) + "\n")


@click.command()
@click.option("--target", default="smollm2", show_default=True)
@click.option(
    "--results",
    default="runs/acceptance-heads.json",
    show_default=True,
    type=click.Path(path_type=Path),
    help="Measurements kept across invocations: a drafter measured again replaces its rows.",
)
@click.option(
    "--out", default="reports/acceptance.md", show_default=True, type=click.Path(path_type=Path)
)
@click.option("--prompts", "num_prompts", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--max-tokens", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--methods", default=",".join(METHODS), show_default=True)
@click.option("--baselines/--no-baselines", default=True, show_default=True)
def main(
    target: str, results: Path, out: Path, num_prompts: int, max_tokens: int, methods: str, baselines: bool
) -> None:
    heads = {m: p for m in methods.split(",") if m and (p := shipped_head_path(target, m)) is not None}
    loaded = load_model(target, numerics="fast")
    configs = drafters(target, heads)
    if not baselines:
        configs = {m: c for m, c in configs.items() if m in heads}
    fresh = measure(loaded, configs, num_prompts, max_tokens, log=click.echo)
    order = [*METHODS, *(n for n in configs if n not in METHODS)]
    rows = {(r.name, r.k): r for r in load_rows(results)} | {(r.name, r.k): r for r in fresh}
    rows = sorted(
        rows.values(), key=lambda r: (order.index(r.name) if r.name in order else len(order), r.name, r.k)
    )
    save_rows(results, rows)
    all_heads = {m: p for m in METHODS if (p := shipped_head_path(target, m)) is not None}
    out.parent.mkdir(parents=True, exist_ok=True)
    # Hand-written notes below the marker survive regeneration.
    notes = out.read_text().partition(NOTES_MARKER)[2] if out.is_file() else ""
    out.write_text(markdown(rows, all_heads, num_prompts, max_tokens) + "\n" + NOTES_MARKER + notes)
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
