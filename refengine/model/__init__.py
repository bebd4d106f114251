"""The decoder-only transformer, its paged KV cache, and the loaders that build it from files."""

from refengine.model.attention import paged_attention
from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.config import Arch, Llama3RopeScaling, ModelConfig, Numerics
from refengine.model.errors import ModelInputError, ModelLoadError
from refengine.model.kv_cache import KVCache, LayerKVCache
from refengine.model.loader import EMBEDDED_NAME, LoadedModel, ModelSource, embedded_smollm2_path, load_model
from refengine.model.tiny import build_tiny_model, save_hf_folder, tiny_config
from refengine.model.transformer import ModelOutput, Transformer

__all__ = [
    "EMBEDDED_NAME",
    "Arch",
    "AttentionMetadata",
    "KVCache",
    "LayerKVCache",
    "Llama3RopeScaling",
    "LoadedModel",
    "ModelConfig",
    "ModelInputError",
    "ModelLoadError",
    "ModelOutput",
    "ModelSource",
    "Numerics",
    "Transformer",
    "build_tiny_model",
    "embedded_smollm2_path",
    "load_model",
    "paged_attention",
    "save_hf_folder",
    "tiny_config",
]
