"""A ladder flag that a dataset record can also set: which one wins, in both orders, as `ladder run
--help` and ladder/README.md say. The one such setting is a request's output length (max_tokens): the
--output-len flag, a JSONL record's `output_len`, a ShareGPT reply's token count (with --tokenizer).
The flag wins over every record; without it the record's own length is used."""

import json
from pathlib import Path

import pytest
from ladder_harness import load_records

from ladder import datasets
from ladder.cli import cli

# flag, what a record can carry, and the wording `--help` and the README use for the winner.
PRECEDENCE = [("--output-len", "output_len", "given, the flag beats every record's")]
FAST = ("--c", "1", "--prompts-per-rung", "2", "--warmup", "0")


@pytest.mark.parametrize(("flag", "field", "wording"), PRECEDENCE)
def test_help_and_readme_say_which_wins(flag, field, wording):
    (option,) = [p for p in cli.commands["run"].params if flag in p.opts]
    assert wording in " ".join(option.help.split()) and field in option.help
    readme = Path(__file__).parents[2].joinpath("ladder", "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith(f"| `{flag}")]
    assert wording in row and f"`{field}`" in row


def test_the_output_len_flag_beats_each_kind_of_record_and_yields_to_none():
    words = lambda text: len(text.split())  # noqa: E731 - a word-level tokenizer
    jsonl = datasets.Dataset("jsonl", "x", 2, (datasets.DatasetRequest((("user", "a"),), 3),
                                               datasets.DatasetRequest((("user", "b"),), 9)))
    sharegpt = datasets.Dataset("sharegpt", "x", 1, (datasets.DatasetRequest((("user", "a"),), None, "one two three"),))
    # The record alone sets the length; the flag, given, beats it, whether the record's is shorter or longer.
    assert [r.output_len for r in datasets.select(jsonl, words, None, None)] == [3, 9]
    assert [r.output_len for r in datasets.select(jsonl, words, 5, None)] == [5, 5]
    assert [r.output_len for r in datasets.select(sharegpt, words, None, None)] == [3]
    assert [r.output_len for r in datasets.select(sharegpt, words, 5, None)] == [5]


@pytest.mark.parametrize(("args", "max_tokens"), [((), 3), (("--output-len", "5"), 5)], ids=["record", "flag"])
def test_ladder_run_sends_the_winner_as_max_tokens(fake_server, ladder, tmp_path, args, max_tokens):
    data = tmp_path / "reqs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "output_len": 3}) + "\n" for i in range(4)))
    url = fake_server()
    code, out, err, run = ladder("--base-url", url, "--dataset", f"jsonl:{data}", *FAST, *args)
    assert code == 0, (out, err)
    assert {r["max_tokens"] for r in load_records(run)} == {max_tokens}
