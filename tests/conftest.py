"""Shared fixtures: tiny random-weight models (milliseconds) and the embedded SmolLM2 (loaded once)."""

import pytest

from refengine.model import LoadedModel, build_tiny_model, load_model


@pytest.fixture(params=["llama", "qwen3"])
def tiny_model(request: pytest.FixtureRequest) -> LoadedModel:
    return build_tiny_model(request.param, seed=0)


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    return load_model("smollm2")
