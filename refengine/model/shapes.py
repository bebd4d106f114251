"""Named model shapes with seeded random weights, for speed studies at real sizes.

`load_model("random:qwen3-8b")` builds one (a bare `qwen3-8b` is refused there, naming the prefix). The weights are generated
directly on the target device (a CUDA generator when the device is a GPU), so an 8B model is ready in
about a second; they depend on (shape, seed, dtype, device type). The tokenizer is byte-level over the
model's whole vocabulary: ids 0-255 are bytes, then the ChatML specials, and every further id decodes
to a fixed three-byte filler. These models exist to time the engine, not to read its output.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from refengine.model.config import Arch, ModelConfig, Numerics
from refengine.model.errors import ModelLoadError
from refengine.model.loader import LoadedModel, ModelSource
from refengine.model.transformer import Transformer
from refengine.tokenizer import Tokenizer

RANDOM_PREFIX = "random:"
_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SHAPES: dict[str, ModelConfig] = {
    # Qwen/Qwen3-8B config.json
    "qwen3-8b": ModelConfig(
        arch=Arch.QWEN3, vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
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


def weight_bytes_per_step(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of weights one decode step reads: every projection, the norms and the lm_head (the
    embedding when tied); the input embedding is not counted, since only the batch's rows are read."""
    per_layer = (
        config.hidden_size * (config.q_size + 2 * config.kv_size)  # qkv_proj
        + config.q_size * config.hidden_size  # o_proj
        + config.hidden_size * 2 * config.intermediate_size  # gate_up_proj
        + config.intermediate_size * config.hidden_size  # down_proj
        + 2 * config.hidden_size  # the two layer norms
        + (2 * config.head_dim if config.qk_norm else 0)
    )
    total = config.num_hidden_layers * per_layer + config.hidden_size + config.vocab_size * config.hidden_size
    return total * dtype.itemsize


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V one cached token holds over all layers (what attention reads per key)."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * dtype.itemsize


@functools.cache
def _tokenizer(vocab_size: int) -> Tokenizer:
    """Byte-level, no merges, over exactly `vocab_size` ids (fillers as plain vocabulary entries, so
    building it takes milliseconds where thousands of added tokens would take seconds)."""
    alphabet = list(pre_tokenizers.ByteLevel.alphabet())
    alphabet.sort(key=lambda ch: _BYTE_ORDER.get(ch, 1 << 20))
    vocab = {ch: i for i, ch in enumerate(alphabet[:256])}
    for special in _SPECIAL_TOKENS:
        vocab[special] = len(vocab)
    filler = (a + b + c for a in alphabet for b in alphabet for c in alphabet)
    while len(vocab) < vocab_size:
        vocab.setdefault(next(filler), len(vocab))
    backend = Backend(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _SPECIAL_TOKENS])
    return Tokenizer(
        backend,
        bos_token_id=None,
        eos_token_ids=(vocab["<|im_end|>"],),
        add_bos=False,
        chat_template=_CHATML,
    )


def _byte_order() -> dict[str, int]:
    """GPT-2's byte-level character for each byte value: char -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return {char: b for b, char in chars.items()}


_BYTE_ORDER = _byte_order()


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
    return LoadedModel(model.eval(), _tokenizer(config.vocab_size), config, source)
