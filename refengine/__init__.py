"""refengine: a reference engine for async scheduling with speculative decoding.

`from refengine import LLM, SamplingParams, EngineConfig`, as with vllm. The names load on first use,
so importing the package (and the `refengine` command) does not import torch.
"""

import importlib

_EXPORTS = {
    "LLM": "refengine.engine.llm",
    "SamplingParams": "refengine.sampling_params",
    "StructuredOutputsParams": "refengine.sampling_params",
    "EngineConfig": "refengine.config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'refengine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
