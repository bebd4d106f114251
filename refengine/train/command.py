"""`refengine train-drafter`: train a drafter head for a target by self-distillation, on the CPU."""

import shlex
import time
from pathlib import Path

import click
import torch

from refengine.engine.arg_utils import EngineArgs
from refengine.model.loader import LoadedModel, load_model
from refengine.train.data import CACHE_ROOT, FINAL, DataSpec, distill_set, layer_key, target_id
from refengine.train.evaluate import offline_acceptance
from refengine.train.trainer import METHODS, TrainConfig, required_features, save_trained_head, train_head

HELD_OUT_SEED = 1
HELD_OUT_BATCH = 16  # prompts per generated chunk: a small check costs one small chunk


def capture_layers(loaded: LoadedModel, names: list[str]) -> tuple[int, ...]:
    """The layers to capture while generating: those `names` need, plus every layer the default
    heads of all methods read, so one distillation set serves them all."""
    wanted = {int(n.removeprefix("layer.")) for n in names if n != FINAL}
    for method in METHODS:
        wanted |= {
            int(n.removeprefix("layer."))
            for n in required_features(method, loaded, TrainConfig(method))
            if n != FINAL
        }
    return tuple(sorted(wanted))


def command_line(params: dict) -> str:
    """The canonical command for these options (every value spelled out, so it reproduces the run)."""
    parts = ["refengine", "train-drafter"]
    for name, value in params.items():
        if value is None:
            continue
        parts += [f"--{name.replace('_', '-')}", str(value)]
    return shlex.join(parts)


def run_training(
    loaded: LoadedModel,
    cfg: TrainConfig,
    out: Path,
    *,
    num_tokens: int,
    max_new_tokens: int,
    eval_tokens: int,
    cache_root: Path,
    command: str,
    data_batch: int = 64,
    log=print,
) -> dict:
    """Data (cached), training, saving, and an offline held-out acceptance check; returns the
    training record written into config.json."""
    needed = required_features(cfg.method, loaded, cfg)
    capture = capture_layers(loaded, needed)
    spec = DataSpec(target_id(loaded), cfg.seed, num_tokens, max_new_tokens, batch=data_batch)
    data = distill_set(
        loaded, spec, [FINAL, *(layer_key(i) for i in capture)], capture, cache_root=cache_root, log=log
    )
    head, config, summary = train_head(loaded, data, cfg, log=log)
    record = {
        "command": command,
        "seed": cfg.seed,
        "steps": cfg.steps,
        "data": {
            "sequences": data.num_sequences,
            "positions": len(data.tokens),
            "generated": data.num_generated,
        },
        "train_seconds": summary["seconds"],
        "final_metrics": {k: round(v, 4) for k, v in summary["final"].items()},
    }
    if eval_tokens:
        held_spec = DataSpec(
            target_id(loaded), HELD_OUT_SEED, eval_tokens, max_new_tokens, held_out=True, batch=HELD_OUT_BATCH
        )
        held = distill_set(
            loaded,
            held_spec,
            [FINAL, *(layer_key(i) for i in capture)],
            capture,
            cache_root=cache_root,
            log=log,
        )
        acceptance = offline_acceptance(head, held, k=8)
        record["held_out_offline"] = {
            "anchors": acceptance.num_steps,
            "per_position": [round(a, 4) for a in acceptance.per_position],
            "mean_accepted_length": {str(k): round(acceptance.at(k), 3) for k in (2, 4, 8)},
        }
        log(
            f"held-out (offline, {acceptance.num_steps} anchors): per position "
            + " ".join(f"{a:.2f}" for a in acceptance.per_position)
            + "; mean accepted length "
            + ", ".join(f"k={k}: {acceptance.at(k):.2f}" for k in (2, 4, 8))
        )
    save_trained_head(head, config, out, record)
    log(f"saved {out}")
    return record


@click.command("train-drafter")
@click.option(
    "--target", default=EngineArgs.model, show_default=True, help="smollm2 (embedded), a .gguf file or an HF folder."
)
@click.option("--method", required=True, type=click.Choice(METHODS))
@click.option(
    "--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Folder for the head."
)
@click.option(
    "--tokens",
    default=48000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Positions (prompt and continuation) of self-distillation data to generate.",
)
@click.option("--steps", default=400, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--seed", default=0, show_default=True, type=int, help="Seeds the prompts, data order and head."
)
@click.option("--lr", default=1e-3, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option(
    "--batch-tokens",
    default=512,
    show_default=True,
    type=click.IntRange(min=16),
    help="Padded positions per training batch.",
)
@click.option(
    "--layers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Decoder layers of an eagle or dflash head.",
)
@click.option(
    "--anchors",
    default=16,
    show_default=True,
    type=click.IntRange(min=1),
    help="dflash blocks per sequence and step.",
)
@click.option(
    "--max-new-tokens",
    default=160,
    show_default=True,
    type=click.IntRange(min=8),
    help="Longest continuation the target generates per prompt.",
)
@click.option(
    "--eval-tokens",
    default=3000,
    show_default=True,
    type=click.IntRange(min=0),
    help="Held-out positions for the offline acceptance check at the end (0: skip).",
)
@click.option("--threads", default=None, type=click.IntRange(min=1), help="torch threads (default: torch's).")
@click.option(
    "--cache-dir",
    default=str(CACHE_ROOT),
    show_default=True,
    type=click.Path(path_type=Path),
    help="Where generated distillation data is cached.",
)
def train_drafter_command(
    target,
    method,
    out,
    tokens,
    steps,
    seed,
    lr,
    batch_tokens,
    layers,
    anchors,
    max_new_tokens,
    eval_tokens,
    threads,
    cache_dir,
) -> None:
    """Train a METHOD drafter head for TARGET on its own greedy continuations of seeded prompts
    (self-distillation, nothing downloaded) and save it to OUT, loadable with
    --speculative-config '{"method": METHOD, "model": OUT, ...}'."""
    if threads is not None:
        torch.set_num_threads(threads)
    command = command_line(
        {
            "target": target,
            "method": method,
            "out": out,
            "tokens": tokens,
            "steps": steps,
            "seed": seed,
            "lr": lr,
            "batch-tokens": batch_tokens,
            "layers": layers,
            "anchors": anchors if method == "dflash" else None,
            "max-new-tokens": max_new_tokens,
            "eval-tokens": eval_tokens,
            "threads": threads,
        }
    )
    click.echo(command)
    start = time.monotonic()
    loaded = load_model(target, numerics="fast")
    cfg = TrainConfig(
        method, steps=steps, seed=seed, lr=lr, batch_tokens=batch_tokens, num_layers=layers, anchors=anchors
    )
    run_training(
        loaded,
        cfg,
        out,
        num_tokens=tokens,
        max_new_tokens=max_new_tokens,
        eval_tokens=eval_tokens,
        cache_root=cache_dir,
        command=command,
        log=click.echo,
    )
    click.echo(f"done in {time.monotonic() - start:.0f}s")
