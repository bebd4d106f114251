"""Shared fixtures: tiny random-weight models (milliseconds) and the embedded SmolLM2 (loaded once)."""

import pytest

from refengine.model import LoadedModel, build_tiny_model, load_model


@pytest.fixture(params=["llama", "qwen3"])
def tiny_model(request: pytest.FixtureRequest) -> LoadedModel:
    return build_tiny_model(request.param, seed=0)


@pytest.fixture(scope="session")
def tiny4() -> LoadedModel:
    """A tiny target deep enough for EAGLE3's default aux layers (2, L // 2, L - 3 need L >= 4)."""
    return build_tiny_model("qwen3", seed=3, num_hidden_layers=4)


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    return load_model("smollm2")
