"""LoadedModel: a model with its tokenizer, config and source, as every model builder returns it. Below
the builders (loader, shapes, tiny), so the loader can dispatch to them without an import circle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from refengine.model.config import ModelConfig
    from refengine.model.transformer import Transformer
    from refengine.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where the weights came from; benchmark results record it."""

    path: str
    format: Literal["gguf", "hf", "random"]
    weight_type: str
    arch: str


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer
    config: ModelConfig
    source: ModelSource
