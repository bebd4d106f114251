"""refengine: a reference engine for async scheduling with speculative decoding.

`from refengine import LLM, SamplingParams, EngineConfig`, as with vllm. The names load on first use,
so importing the package (and the `refengine` command) does not import torch.
"""

from refengine.lazy_exports import lazy_exports

_EXPORTS = {
    "LLM": "refengine.engine.llm",
    "SamplingParams": "refengine.sampling_params",
    "StructuredOutputsParams": "refengine.sampling_params",
    "EngineConfig": "refengine.config",
}
__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
