"""The acceptance report of the shipped heads: engine runs on the held-out ShareGPT split (the
opening turns of conversations no head trained on), next to earlier heads and ngram.

    make acceptance-report
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
from refengine.model.loaded_model import LoadedModel
from refengine.model.loader import load_model
from refengine.sampling_params import SamplingParams
from refengine.spec_decode.config import SpeculativeConfig
from refengine.train.draft_vocab import without_draft_vocab
from refengine.train.evaluate import Acceptance, engine_acceptance
from refengine.train.regenerate import chat_ids
from refengine.train.sharegpt import file_sha256, held_out_first_turns
from refengine.train.trainer import METHODS

KS = (4,)
NOTES_MARKER = "<!-- notes: kept when the tables are regenerated -->"


@dataclass(frozen=True)
class Row:
    name: str
    k: int
    acceptance: Acceptance
    seconds: float


# The measured groups beside the shipped heads, by the label suffix their rows carry, in the report's order.
FULL_VOCABULARY, REPRODUCED, OLD = " (full vocabulary)", " (reproduced)", " (old)"
SUFFIXES = ("", FULL_VOCABULARY, REPRODUCED, OLD)


def drafters(groups: dict[str, dict[str, Path]]) -> dict[str, dict]:
    """`groups[suffix]`: head folders by method; each becomes the drafter `method + suffix`, then ngram."""
    configs = {
        f"{m}{suffix}": {"method": m, "model": str(path)}
        for suffix in SUFFIXES
        for m, path in groups.get(suffix, {}).items()
    }
    configs["ngram"] = {"method": "ngram"}
    return configs


def measure(
    loaded: LoadedModel, configs: dict[str, dict], prompt_ids: list[list[int]], max_tokens: int, log=print
) -> list[Row]:
    prompts = prompt_ids
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


def markdown(rows: list[Row], heads: dict[str, Path], num_prompts: int, max_tokens: int, basis: str) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "# Acceptance of the shipped SmolLM2 drafter heads",
        "",
        f"Engine runs (greedy, fast numerics, one batch of {num_prompts}) on {basis}, under the chat "
        f"template, at most {max_tokens} new tokens each, a reply stopping at EOS. Acceptance at draft "
        "position i is the share of verify steps whose i-th draft was accepted; mean accepted length is "
        "1 + accepted drafts per verify step (vLLM's definition, the bonus token included). "
        "`(old)`: the heads shipped before, trained on 48,000 positions of synthetic prompts on two CPU cores."
        + (
            " `(reproduced)`: a head trained again with the shipped head's command and seed, its data regenerated "
            "by that command (the training's reproducibility)."
            if any(r.name.endswith(REPRODUCED) for r in rows)
            else ""
        )
        + (
            " `(full vocabulary)`: the shipped head without its draft vocabulary, drafting over the target's whole "
            "lm_head as the trainer left it (the heads' section says how the vocabulary was made)."
            if any(r.name.endswith(FULL_VOCABULARY) for r in rows)
            else ""
        ),
        f"Commit {commit}, {time.strftime('%Y-%m-%d')}, on the CPU: torch {torch.__version__}, Python {platform.python_version()}, "
        f"{torch.get_num_threads()} threads.",
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
        if "sha256" in training.get("data", {}):
            data = training["data"]
            lines.append(
                f"- data: {data['sequences']} ShareGPT training-split sequences, {data['generated']} generated "
                f"tokens, sha256 `{data['sha256'][:16]}…` (prompts file sha256 `{data['prompts']['sha256'][:16]}…`)"
            )
        if "held_out_offline" in training:
            offline = training["held_out_offline"]
            lengths = ", ".join(f"k={k}: {v}" for k, v in offline["mean_accepted_length"].items())
            # Records written before the check walked the engine's loop counted every position of a reply
            # as a step ("anchors"), which overstates the engine's figure (refengine/train/evaluate.py).
            counted = (
                f"the engine loop's steps, {offline['steps']['4']} at k=4"
                if "steps" in offline
                else f"every position counted as a step, {offline['anchors']} of them: an overstatement"
            )
            lines.append(
                f"- offline held-out check at the end of training ({counted}): per position "
                + " ".join(f"{a:.2f}" for a in offline["per_position"])
                + f"; mean accepted length {lengths}"
            )
        if "draft_vocab" in config:
            vocab = config["draft_vocab"]
            lines.append(
                f"- draft vocabulary: its own lm_head over the {config['draft_vocab_size']} most frequent tokens of the "
                f"training split ({vocab['coverage']:.1%} of its {vocab['training_split_tokens']} tokens; `(full "
                f"vocabulary)` above is the head without it): `{vocab['command']}`"
            )
        lines.append("")
    return "\n".join(lines)


def load_rows(path: Path, num_prompts: int, max_tokens: int) -> list[Row]:
    """The rows kept from earlier invocations on the same basis: a row measured on other prompts or
    lengths would sit in the tables beside rows it cannot be compared with."""
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
        if (r.get("num_prompts"), r.get("max_tokens")) == (num_prompts, max_tokens)
    ]


def save_rows(path: Path, rows: list[Row], num_prompts: int, max_tokens: int) -> None:
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
            "num_prompts": num_prompts,
            "max_tokens": max_tokens,
        }
        for r in rows
    ]
    path.write_text(json.dumps(records, indent=1) + "\n")


@click.command()
@click.option("--target", default="smollm2", show_default=True)
@click.option(
    "--prompts",
    "prompts_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The file `refengine export-prompts` writes; its held-out split's opening turns are the prompts.",
)
@click.option(
    "--old-heads",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="A folder of earlier heads (one subfolder per method) to measure beside the shipped ones.",
)
@click.option(
    "--reproduced",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="A folder of heads retrained with the shipped heads' commands and seed (one subfolder per method), "
    "measured beside them: the training's reproducibility.",
)
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
@click.option("--num-prompts", default=16, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--max-tokens",
    default=256,
    show_default=True,
    type=click.IntRange(min=1),
    help="New tokens at most per prompt; each reply may stop at EOS first. 256 is the reply length the heads "
    "were trained on; a shorter cap scores only a reply's opening, where drafts are accepted least.",
)
@click.option("--methods", default=",".join(METHODS), show_default=True)
@click.option("--baselines/--no-baselines", default=True, show_default=True)
def main(
    target: str,
    prompts_file: Path,
    old_heads: Path | None,
    reproduced: Path | None,
    results: Path,
    out: Path,
    num_prompts: int,
    max_tokens: int,
    methods: str,
    baselines: bool,
) -> None:
    chosen = [m for m in methods.split(",") if m]
    heads = {m: p for m in chosen if (p := shipped_head_path(target, m)) is not None}
    old = {m: old_heads / m for m in chosen if old_heads and (old_heads / m / "config.json").is_file()}
    loaded = load_model(target, numerics="fast")
    again = {m: reproduced / m for m in chosen if reproduced and (reproduced / m / "config.json").is_file()}
    # A head with a draft vocabulary is measured without it too (the trained head as the trainer left it).
    full = {
        m: without_draft_vocab(p, results.parent / "acceptance-full-vocabulary" / m)
        for m, p in heads.items()
        if "draft_vocab" in json.loads((p / "config.json").read_text())
    }
    configs = drafters({"": heads, FULL_VOCABULARY: full, REPRODUCED: again, OLD: old})
    if not baselines:
        configs = {m: c for m, c in configs.items() if c["method"] != "ngram"}
    held = held_out_first_turns(prompts_file, num_prompts)
    prompt_ids = [chat_ids(loaded, p) for p in held]
    fresh = measure(loaded, configs, prompt_ids, max_tokens, log=click.echo)
    order = [*(f"{m}{suffix}" for suffix in SUFFIXES for m in METHODS), "ngram"]
    kept = load_rows(results, len(held), max_tokens)
    rows = {(r.name, r.k): r for r in kept} | {(r.name, r.k): r for r in fresh}
    rows = sorted(
        rows.values(), key=lambda r: (order.index(r.name) if r.name in order else len(order), r.name, r.k)
    )
    save_rows(results, rows, len(held), max_tokens)
    all_heads = {m: p for m in METHODS if (p := shipped_head_path(target, m)) is not None}
    basis = (
        f"the opening turns of the first {len(held)} held-out ShareGPT conversations (`{prompts_file.name}`, "
        f"sha256 `{file_sha256(prompts_file)[:16]}…`; one conversation in ten is held out by a hash of its id, "
        "and no head trained on any turn of those)"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    # Hand-written notes below the marker survive regeneration.
    notes = out.read_text().partition(NOTES_MARKER)[2] if out.is_file() else ""
    out.write_text(markdown(rows, all_heads, len(held), max_tokens, basis) + "\n" + NOTES_MARKER + notes)
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
