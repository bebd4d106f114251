"""The decoder-only transformer, its paged KV cache, and the loaders that build it from files.

The names load on first use, so a torch-free submodule (`refengine.model.config`, whose attention backends
`refengine serve --help` lists) can be imported without importing torch.
"""

from refengine.lazy_exports import lazy_exports

_EXPORTS = {
    "EMBEDDED_NAME": "refengine.model.loader",
    "Arch": "refengine.model.config",
    "AttentionMetadata": "refengine.model.attention_metadata",
    "KVCache": "refengine.model.kv_cache",
    "LayerKVCache": "refengine.model.kv_cache",
    "Llama3RopeScaling": "refengine.model.config",
    "LoadedModel": "refengine.model.loaded_model",
    "ModelConfig": "refengine.model.config",
    "ModelInputError": "refengine.model.errors",
    "ModelLoadError": "refengine.model.errors",
    "ModelOutput": "refengine.model.transformer",
    "ModelSource": "refengine.model.loaded_model",
    "Numerics": "refengine.model.config",
    "Transformer": "refengine.model.transformer",
    "build_tiny_model": "refengine.model.tiny",
    "embedded_smollm2_path": "refengine.model.loader",
    "load_model": "refengine.model.loader",
    "paged_attention": "refengine.model.attention",
    "save_hf_folder": "refengine.model.tiny",
    "tiny_config": "refengine.model.tiny",
}
__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
