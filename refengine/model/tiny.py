"""Tiny random-weight models, for tests that must run in milliseconds and for HF parity checks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from refengine.model.config import Arch, ModelConfig, Numerics
from refengine.model.loaded_model import LoadedModel, ModelSource
from refengine.model.transformer import Transformer
from refengine.model.weights import hf_state_dict
from refengine.tokenizer import Tokenizer

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_HF_CLASSES = {Arch.LLAMA: "LlamaForCausalLM", Arch.QWEN3: "Qwen3ForCausalLM"}


def tiny_config(
    arch: Arch | str = Arch.LLAMA, *, num_hidden_layers: int = 2, vocab_size: int = 320
) -> ModelConfig:
    """Llama ties its embeddings (as SmolLM2 does), Qwen3 does not, so both paths get exercised."""
    arch = Arch(arch)
    return ModelConfig(
        arch=arch,
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=2.0**-20,  # exact in float32, so a GGUF round trip keeps it bit for bit
        rope_theta=10000.0,
        max_position_embeddings=1024,
        tie_word_embeddings=arch is Arch.LLAMA,
    )


def build_tiny_model(
    arch: Arch | str = Arch.LLAMA,
    *,
    seed: int = 0,
    numerics: Numerics | str = Numerics.BATCH_INVARIANT,
    num_hidden_layers: int = 2,
    dtype: torch.dtype = torch.float32,
) -> LoadedModel:
    config = tiny_config(arch, num_hidden_layers=num_hidden_layers)
    model = Transformer(config, Numerics(numerics), dtype)
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=generator)
        if name.endswith("norm.weight"):
            values = 1.0 + 0.1 * noise
        elif name == "embed_tokens.weight":
            values = noise
        else:  # keep activations near unit scale: std 1/sqrt(fan_in)
            values = noise / math.sqrt(param.shape[1])
        param.data.copy_(values.to(dtype))
    tokenizer = Tokenizer.byte_level(config.vocab_size, SPECIAL_TOKENS, "<|im_end|>", CHATML_TEMPLATE)
    source = ModelSource(
        f"tiny-{config.arch.value}-seed{seed}", "random", str(dtype).removeprefix("torch."), config.arch.value
    )
    return LoadedModel(model.eval(), tokenizer, config, source)


def save_hf_folder(loaded: LoadedModel, folder: Path) -> Path:
    """config.json + model.safetensors + tokenizer files, loadable by `load_model` and by transformers."""
    config = loaded.config
    folder.mkdir(parents=True, exist_ok=True)
    hf_config = {
        "architectures": [_HF_CLASSES[config.arch]],
        "model_type": config.arch.value,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "eos_token_id": list(loaded.tokenizer.eos_token_ids),
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(hf_config, indent=2))
    weights = {name: tensor.contiguous() for name, tensor in hf_state_dict(loaded.model).items()}
    save_file(weights, str(folder / "model.safetensors"))
    loaded.tokenizer.save_hf_folder(folder)
    return folder
