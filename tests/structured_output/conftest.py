"""One structured-output manager on the tiny llama's byte tokenizer for every test here (its compile
threads live until the module's tests are done)."""

import pytest

from refengine.model.tiny import build_tiny_model
from refengine.structured_output.manager import StructuredOutputManager


@pytest.fixture(scope="module")
def manager():
    tiny = build_tiny_model("llama", seed=0)
    manager = StructuredOutputManager(tiny.tokenizer, tiny.config.vocab_size)
    yield manager
    manager.shutdown()
