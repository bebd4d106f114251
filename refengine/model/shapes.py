"""Named model shapes with seeded random weights, for speed studies at real sizes.

`load_model("random:qwen3-8b")` builds one (a bare `qwen3-8b` is refused there, naming the prefix). The weights are generated
directly on the target device (a CUDA generator when the device is a GPU), so an 8B model is ready in
about a second; they depend on (shape, seed, dtype, device type). The tokenizer is byte-level over the
model's whole vocabulary (refengine.tokenizer.byte_level). These models exist to time the engine, not
to read its output; the bytes they cost per step are in refengine.model.roofline.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from refengine.model.config import Arch, ModelConfig, Numerics
from refengine.model.errors import ModelLoadError
from refengine.model.loaded_model import LoadedModel, ModelSource
from refengine.model.transformer import Transformer
from refengine.tokenizer.byte_level import byte_level_tokenizer

RANDOM_PREFIX = "random:"
SHAPES: dict[str, ModelConfig] = {
    # Qwen/Qwen3-8B config.json
    "qwen3-8b": ModelConfig(
        arch=Arch.QWEN3, vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=40960, tie_word_embeddings=False,
    ),
    # Qwen/Qwen3-32B config.json (the tensor-parallel benchmark's target)
    "qwen3-32b": ModelConfig(
        arch=Arch.QWEN3, vocab_size=151936, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
        num_attention_heads=64, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=40960, tie_word_embeddings=False,
    ),
    # Qwen/Qwen3-0.6B config.json
    "qwen3-0.6b": ModelConfig(
        arch=Arch.QWEN3, vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=40960, tie_word_embeddings=True,
    ),
    # meta-llama/Meta-Llama-3-8B config.json (Llama 3.0: no rope scaling, 8k context)
    "llama3-8b": ModelConfig(
        arch=Arch.LLAMA, vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
        max_position_embeddings=8192, tie_word_embeddings=False,
    ),
}  # fmt: skip


def shape_name(name_or_path: str) -> str | None:
    """The shape a model name asks for: `random:NAME`, or a bare NAME; None for anything else."""
    name = name_or_path.removeprefix(RANDOM_PREFIX)
    if name in SHAPES:
        return name
    if name_or_path.startswith(RANDOM_PREFIX):
        raise ModelLoadError(f"no model shape {name!r}; known shapes: {', '.join(SHAPES)}")
    return None


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def build_random_model(
    name: str,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    numerics: Numerics | str = Numerics.FAST,
    device: torch.device | str | None = None,
    **overrides,
) -> LoadedModel:
    """A `SHAPES[name]` model with seeded random weights made on `device` (default: CUDA if present).

    `overrides` replace config fields (tests shrink the layer count or vocabulary)."""
    shape = shape_name(name) or name
    if shape not in SHAPES:
        raise ModelLoadError(f"no model shape {name!r}; known shapes: {', '.join(SHAPES)}")
    config = dataclasses.replace(SHAPES[shape], **overrides)
    device = default_device() if device is None else torch.device(device)
    with torch.device(device):
        model = Transformer(config, Numerics(numerics), dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            param.normal_(generator=generator)
            if param_name.endswith("norm.weight"):
                param.mul_(0.1).add_(1.0)
            elif param_name != "embed_tokens.weight":  # activations near unit scale: std 1/sqrt(fan_in)
                param.mul_(1.0 / math.sqrt(param.shape[1]))
    suffix = "" if not overrides else "-" + "-".join(f"{k}{v}" for k, v in sorted(overrides.items()))
    source = ModelSource(
        f"{RANDOM_PREFIX}{shape}{suffix}-seed{seed}", "random", str(dtype).removeprefix("torch."), config.arch.value
    )
    return LoadedModel(model.eval(), byte_level_tokenizer(config.vocab_size), config, source)
