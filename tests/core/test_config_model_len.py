"""EngineConfig.max_model_len's lower bound: exactly 2 (one prompt token plus one generated one)."""

import pytest

from refengine.config import EngineConfig


def test_max_model_len_two_is_the_smallest_accepted():
    # The boundary itself must pass: a 1-token prompt plus 1 generated token fits in 2.
    EngineConfig(max_model_len=2).validate()


def test_max_model_len_one_is_refused_with_the_exact_message():
    expected = (
        r"^EngineConfig\.max_model_len=1 leaves no room for a prompt token "
        r"and a generated token \(need >= 2\)$"
    )
    with pytest.raises(ValueError, match=expected):
        EngineConfig(max_model_len=1).validate()
