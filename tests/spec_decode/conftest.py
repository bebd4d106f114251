"""Fixtures for the drafter tests: a tiny target deep enough for EAGLE3's default aux layers
(2, L // 2, L - 3 need L >= 4), and helpers that run an engine with a given drafter."""

import pytest

from refengine.model import LoadedModel, build_tiny_model

TINY_LAYERS = 4


@pytest.fixture(scope="session")
def tiny4() -> LoadedModel:
    return build_tiny_model("qwen3", seed=3, num_hidden_layers=TINY_LAYERS)
