import re

import pytest

from refengine.sampling_params import SamplingParams


def test_values_are_normalised():
    params = SamplingParams(temperature=0, top_p=1, stop=("a",), stop_token_ids=(5,))
    assert params.temperature == 0.0 and isinstance(params.temperature, float) and params.top_p == 1.0
    assert params.stop == ["a"] and params.stop_token_ids == [5]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.5}, r"temperature .* got -0\.5"),
        ({"temperature": float("nan")}, r"temperature .* got nan"),
        ({"temperature": True}, r"temperature .* got True"),
        ({"top_k": -2}, r"top_k .* got -2"),
        ({"top_k": 2.5}, r"top_k .* got 2\.5"),
        ({"top_p": 0.0}, r"top_p .* got 0\.0"),
        ({"top_p": 1.5}, r"top_p .* got 1\.5"),
        ({"seed": "7"}, r"seed .* got '7'"),
        ({"max_tokens": 0}, r"max_tokens .* got 0"),
        ({"min_tokens": 5, "max_tokens": 4}, r"min_tokens .* max_tokens=4.* got 5"),
        ({"min_tokens": -1}, r"min_tokens .* got -1"),
        ({"stop": "END"}, r"stop must be a list of strings, got 'END'"),
        ({"stop": [""]}, r"stop must hold non-empty strings"),
        ({"stop_token_ids": [3, -1]}, r"stop_token_ids .* got \[3, -1\]"),
        ({"ignore_eos": 1}, r"ignore_eos .* got 1"),
        ({"bad_words": ["ok", 3]}, r"bad_words must hold non-empty strings"),
        ({"bad_words_token_ids": [[]]}, r"bad_words_token_ids .* got \[\[\]\]"),
        ({"bad_words_token_ids": [[1, -4]]}, r"bad_words_token_ids .* got \[1, -4\]"),
    ],
)
def test_invalid_values_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_top_k_off_values_and_seed_accepted():
    assert SamplingParams(top_k=-1).top_k == -1
    assert SamplingParams(top_k=0, seed=-3).seed == -3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1}, "SamplingParams.temperature must be a finite number >= 0, got -1"),
        ({"top_k": -2}, "SamplingParams.top_k must be -1 or 0 (off) or a positive integer, got -2"),
        ({"top_p": 0}, "SamplingParams.top_p must be in (0, 1], got 0"),
        ({"top_p": True}, "SamplingParams.top_p must be in (0, 1], got True"),
        ({"seed": 1.5}, "SamplingParams.seed must be an integer or None, got 1.5"),
        ({"max_tokens": 0}, "SamplingParams.max_tokens must be an integer >= 1, got 0"),
        ({"min_tokens": 3, "max_tokens": 2}, "SamplingParams.min_tokens must be an integer in [0, max_tokens=2], got 3"),
        ({"logprobs": 21}, "SamplingParams.logprobs must be None or an integer in [0, 20], got 21"),
        ({"logprobs": -1}, "SamplingParams.logprobs must be None or an integer in [0, 20], got -1"),
        ({"stop": 5}, "SamplingParams.stop must be a list of strings, got 5"),
        ({"bad_words": [""]}, "SamplingParams.bad_words must hold non-empty strings, got ['']"),
        ({"bad_words_token_ids": 7}, "SamplingParams.bad_words_token_ids must be a list of non-empty token id lists, got 7"),
        ({"stop_token_ids": ["1"]}, "SamplingParams.stop_token_ids must be a list of token ids >= 0, got ['1']"),
    ],
)
def test_messages_are_exact(kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        SamplingParams(**kwargs)


def test_the_edges_are_accepted():
    params = SamplingParams(top_p=1, min_tokens=4, max_tokens=4, logprobs=20, seed=None, bad_words_token_ids=[[0]])
    assert (params.top_p, params.min_tokens, params.logprobs, params.bad_words_token_ids) == (1.0, 4, 20, [[0]])
    assert SamplingParams(logprobs=0, min_tokens=0, stop_token_ids=[0]).logprobs == 0
