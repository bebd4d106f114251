"""A tiny target deep enough for EAGLE3's default aux layers (2, L // 2, L - 3 need L >= 4)."""

import pytest

from refengine.model import LoadedModel, build_tiny_model


@pytest.fixture(scope="session")
def tiny4() -> LoadedModel:
    return build_tiny_model("llama", seed=5, num_hidden_layers=4)
