"""Prompts, calibration, rung result types and request bodies."""

import dataclasses
import json

import pytest

from ladder import prompts
from ladder.client import request_body
from ladder.config import SetupError
from ladder.rung import RungNotRun, RungVoid, to_dict, void_from_failures


def test_calibration_fits_overhead_and_tokens_per_word_exactly():
    cal = prompts.fit((1024, 512), (1372, 689))  # 1024·4//3 + 7, 512·4//3 + 7 (the fake server's rule)
    assert cal.tokens_per_word == (1372 - 689) / 512
    assert cal.overhead_tokens == 1372 - cal.tokens_per_word * 1024
    assert cal.words_for(1024) == round((1024 - cal.overhead_tokens) / cal.tokens_per_word)


def test_calibration_refuses_a_server_whose_count_does_not_grow():
    with pytest.raises(SetupError, match="does not grow"):
        prompts.fit((100, 50), (30, 30))
    with pytest.raises(SetupError, match="below the server's prompt overhead"):
        prompts.fit((100, 50), (150, 100)).words_for(10)


def test_prompts_are_seeded_per_rung_and_phase():
    sizer = prompts.calibrated_sizer(20)
    a = prompts.rung_prompts(0, 4, "measured", 5, sizer)
    assert a == prompts.rung_prompts(0, 4, "measured", 5, sizer)
    assert a[:3] == prompts.rung_prompts(0, 4, "measured", 3, sizer)
    assert a != prompts.rung_prompts(1, 4, "measured", 5, sizer)
    assert a != prompts.rung_prompts(0, 8, "measured", 5, sizer)
    assert a != prompts.rung_prompts(0, 4, "warmup", 5, sizer)
    assert all(len(p.split()) == 20 for p in a) and len(set(a)) == 5


def test_tokenizer_sizer_hits_the_requested_length(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    # A word-level tokenizer whose vocabulary knows half the words: unknown words still cost one token.
    vocab = {w: i for i, w in enumerate(prompts.WORDS[::2])} | {"[UNK]": len(prompts.WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    make = prompts.tokenizer_sizer(prompts.load_tokenizer(tmp_path), 50)
    texts = prompts.rung_prompts(0, 1, "measured", 3, make)
    assert [len(tok.encode(t).ids) for t in texts] == [50, 50, 50]
    with pytest.raises(SetupError, match="cannot load tokenizer"):
        prompts.load_tokenizer(tmp_path / "nope.json")


def test_request_body_carries_usage_options_and_ignore_eos():
    chat = json.loads(request_body("hi", model="m", chat=True, max_tokens=9, temperature=0.0,
                                   continuous_usage=True))
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and chat["max_tokens"] == 9
    assert chat["stream"] and chat["ignore_eos"]
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    plain = json.loads(request_body("hi", model="m", chat=False, max_tokens=9, temperature=0.0,
                                    continuous_usage=False))
    assert plain["prompt"] == "hi" and plain["stream_options"] == {"include_usage": True}


def test_void_rung_cannot_carry_numbers():
    numeric = (int, float)
    for cls in (RungVoid, RungNotRun):
        names = {f.name for f in dataclasses.fields(cls)}
        assert not names & {"stats", "audit", "spec"}
    v = void_from_failures(4, 3, ["http_error: HTTP 500: a", "http_error: HTTP 500: a", "timeout: b",
                                  "truncated: c", "zero_tokens: d", "no_usage: e", "length_mismatch: f"],
                           "hash", None)
    assert v.reason == "http_error, timeout, truncated, zero_tokens, no_usage, length_mismatch"
    assert v.errors == ("http_error: HTTP 500: a", "timeout: b", "truncated: c", "zero_tokens: d", "no_usage: e")
    assert (v.num_ok, v.num_failed) == (3, 7)
    row = to_dict(v)
    assert row["status"] == "VOID"
    assert [k for k, val in row.items() if isinstance(val, numeric) and k not in
            ("concurrency", "num_ok", "num_failed")] == []
    dead = void_from_failures(4, 0, [], "hash", "stall: no chunk")
    assert dead.reason == "engine_dead: stall: no chunk"
