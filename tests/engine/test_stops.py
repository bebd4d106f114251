"""Stop handling through the whole engine: stop strings across token boundaries, bad_words,
min_tokens with stop ids, and max_tokens (scheduler-level cases live in tests/core)."""

import dataclasses

import pytest

from refengine.engine.llm import LLM
from refengine.model.tiny import build_tiny_model
from refengine.sampling_params import SamplingParams

PROMPT = [ord(c) for c in "Once upon a time"]


@pytest.fixture(scope="module")
def llm():
    return LLM(build_tiny_model("qwen3", seed=5), num_blocks=128, block_size=4, max_model_len=128)


def greedy(**kw):
    kw.setdefault("max_tokens", 40)
    return SamplingParams(temperature=0.0, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def base(llm):
    (out,) = llm.generate([PROMPT], greedy())
    assert len(out.token_ids) == 40 and out.finish_reason == "length"
    return out


def first_new_pair(text: str, start: int) -> str:
    """A two-character stop string whose first occurrence is at or after `start`."""
    i = next(i for i in range(start, len(text) - 1) if text.find(text[i : i + 2]) == i)
    return text[i : i + 2]


def test_stop_string_spanning_token_boundaries(llm, base):
    stop = first_new_pair(base.text, 1)  # at least two byte tokens: the match spans a token boundary
    (out,) = llm.generate([PROMPT], greedy(stop=[stop]))
    assert out.finish_reason == "stop"
    assert out.text == base.text[: base.text.index(stop)]
    assert stop not in out.text
    assert out.token_ids == base.token_ids[: len(out.token_ids)] and len(out.token_ids) < 40


def test_stop_token_ids_respect_min_tokens(llm, base):
    stop_id = base.token_ids[1]
    (early,) = llm.generate([PROMPT], greedy(stop_token_ids=[stop_id]))
    assert early.token_ids == base.token_ids[:2] and early.finish_reason == "stop"
    (late,) = llm.generate([PROMPT], greedy(stop_token_ids=[stop_id], min_tokens=6))
    assert len(late.token_ids) >= 6 and stop_id not in late.token_ids[:6]
    assert late.finish_reason == "length" or late.token_ids[-1] == stop_id


def test_max_tokens_is_exact(llm):
    outs = llm.generate([PROMPT, PROMPT[:5]], [greedy(max_tokens=1), greedy(max_tokens=7)])
    assert [len(o.token_ids) for o in outs] == [1, 7]
    assert all(o.finish_reason == "length" for o in outs)


def test_bad_words_single_and_multi_token(llm, base):
    # bad_words strings go through the tokenizer; an ASCII character is one byte token here.
    banned_id = next(t for t in base.token_ids if t < 128)
    (single,) = llm.generate([PROMPT], greedy(bad_words=[chr(banned_id)]))
    assert banned_id not in single.token_ids
    assert single.token_ids != base.token_ids

    # A two-token sequence, given as token ids (the tiny model's output is mostly not printable).
    ids = base.token_ids
    pairs = [(ids[j], ids[j + 1]) for j in range(len(ids) - 1)]
    i = next(j for j in range(3, len(ids) - 1) if pairs.index(pairs[j]) == j)
    (multi,) = llm.generate([PROMPT], greedy(bad_words_token_ids=[list(pairs[i])]))
    # Everything before the banned continuation is unchanged; the pair's second token is replaced.
    prefix = base.token_ids[: i + 1]
    assert multi.token_ids[: i + 1] == prefix
    assert multi.token_ids[i + 1] != base.token_ids[i + 1]


EOS_PROMPT = [ord(c) for c in ',\\Rp*"']  # greedy emits eos as its 4th token on this model


def test_eos_stops_and_is_masked_below_min_tokens(llm):
    """Without ignore_eos: eos ends the request, and below min_tokens it is masked out of sampling
    (not merely ignored by the stop check), as vLLM's min_tokens does."""
    eos = llm.tokenizer.eos_token_ids[0]
    (ignored,) = llm.generate([EOS_PROMPT], greedy(max_tokens=12))
    assert ignored.token_ids[3] == eos and eos not in ignored.token_ids[:3]
    (stopped,) = llm.generate([EOS_PROMPT], SamplingParams(temperature=0.0, max_tokens=12))
    assert stopped.token_ids == ignored.token_ids[:4] and stopped.finish_reason == "stop"
    (late,) = llm.generate([EOS_PROMPT], SamplingParams(temperature=0.0, max_tokens=12, min_tokens=6))
    assert late.token_ids[:3] == ignored.token_ids[:3] and len(late.token_ids) >= 6
    assert eos not in late.token_ids[:6]
    assert late.finish_reason == "length" or late.token_ids[-1] == eos
    # ignore_eos: eos is an ordinary token, sampled below min_tokens as anywhere else.
    (kept,) = llm.generate([EOS_PROMPT], greedy(max_tokens=12, min_tokens=6))
    assert kept.token_ids == ignored.token_ids


def test_top_k_1_samples_the_argmax(llm, base):
    """top_k reaches the sampler: at temperature 1, top_k=1 leaves only the argmax, so the output is the
    greedy one; without top_k the seeded samples leave it."""
    sampled = SamplingParams(temperature=1.0, seed=3, max_tokens=40, ignore_eos=True)
    (top1,) = llm.generate([PROMPT], dataclasses.replace(sampled, top_k=1))
    assert top1.token_ids == base.token_ids
    (free,) = llm.generate([PROMPT], sampled)
    assert free.token_ids != base.token_ids
