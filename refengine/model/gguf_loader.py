"""Reading a llama.cpp GGUF file: hyperparameters, vocabulary and HF-named float tensors."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import torch

from refengine.model.config import Arch, ModelConfig
from refengine.model.errors import ModelLoadError
from refengine.model.gguf_file import GgufFile
from refengine.tokenizer import GgufVocab

_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


@dataclass(frozen=True, slots=True)
class GgufCheckpoint:
    file: GgufFile
    config: ModelConfig
    vocab: GgufVocab
    weight_type: str

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight under its HF name, dequantized, with llama.cpp's q/k row order undone."""
        for name in self.file.tensor_names:
            hf_name = _hf_name(name, self.file.path)
            tensor = self.file.tensor(name)
            if self.config.arch is Arch.LLAMA and name.endswith((".attn_q.weight", ".attn_k.weight")):
                heads = (
                    self.config.num_attention_heads if ".attn_q." in name else self.config.num_key_value_heads
                )
                tensor = _unpermute_rows(tensor, heads)
            yield hf_name, tensor


def _hf_name(name: str, path: Path) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    if name == "rope_freqs.weight":
        raise ModelLoadError(
            f"{path}: tensor 'rope_freqs.weight' (llama3 rope scaling in GGUF) is not supported"
        )
    match = _BLOCK.match(name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        raise ModelLoadError(f"{path}: unexpected tensor {name!r}")
    layer, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[kind]}.weight"


def _unpermute_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp interleaves each head's two rotary halves (row i of the first half, then row i of the
    second); put the halves back one after the other, as HF's `rotate_half` expects."""
    rows, cols = weight.shape
    return weight.reshape(num_heads, rows // num_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def read_gguf(path: Path) -> GgufCheckpoint:
    file = GgufFile(path)
    arch_name = file.string("general.architecture")
    try:
        arch = Arch(arch_name)
    except ValueError:
        supported = ", ".join(a.value for a in Arch)
        raise ModelLoadError(
            f"{path}: unsupported architecture {arch_name!r} (supported: {supported})"
        ) from None
    vocab = _read_vocab(file)
    config = _read_config(file, arch, len(vocab.tokens))
    return GgufCheckpoint(file=file, config=config, vocab=vocab, weight_type=_weight_type(file))


def _read_config(file: GgufFile, arch: Arch, num_tokens: int) -> ModelConfig:
    prefix = arch.value
    hidden = file.integer(f"{prefix}.embedding_length")
    heads = file.integer(f"{prefix}.attention.head_count")
    key = f"{prefix}.attention"
    return ModelConfig(
        arch=arch,
        vocab_size=file.integer(f"{prefix}.vocab_size") if file.has(f"{prefix}.vocab_size") else num_tokens,
        hidden_size=hidden,
        intermediate_size=file.integer(f"{prefix}.feed_forward_length"),
        num_hidden_layers=file.integer(f"{prefix}.block_count"),
        num_attention_heads=heads,
        num_key_value_heads=file.integer(f"{key}.head_count_kv")
        if file.has(f"{key}.head_count_kv")
        else heads,
        head_dim=file.integer(f"{key}.key_length") if file.has(f"{key}.key_length") else hidden // heads,
        rms_norm_eps=file.number(f"{key}.layer_norm_rms_epsilon"),
        rope_theta=file.number(f"{prefix}.rope.freq_base")
        if file.has(f"{prefix}.rope.freq_base")
        else 10000.0,
        max_position_embeddings=file.integer(f"{prefix}.context_length"),
        tie_word_embeddings="output.weight" not in file.tensor_names,
    )


def _read_vocab(file: GgufFile) -> GgufVocab:
    def optional_int(key: str) -> int | None:
        return file.integer(key) if file.has(key) else None

    eos_ids = [optional_int("tokenizer.ggml.eos_token_id"), optional_int("tokenizer.ggml.eot_token_id")]
    return GgufVocab(
        model=file.string("tokenizer.ggml.model"),
        pre=file.string("tokenizer.ggml.pre") if file.has("tokenizer.ggml.pre") else "default",
        tokens=tuple(file.list_of("tokenizer.ggml.tokens")),
        token_types=tuple(file.list_of("tokenizer.ggml.token_type"))
        if file.has("tokenizer.ggml.token_type")
        else (),
        merges=tuple(file.list_of("tokenizer.ggml.merges")) if file.has("tokenizer.ggml.merges") else (),
        bos_token_id=optional_int("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(i for i in eos_ids if i is not None)),
        add_bos=file.boolean("tokenizer.ggml.add_bos_token")
        if file.has("tokenizer.ggml.add_bos_token")
        else False,
        chat_template=file.string("tokenizer.chat_template") if file.has("tokenizer.chat_template") else None,
    )


def _weight_type(file: GgufFile) -> str:
    """The file's declared quantization (`general.file_type`), else its most common tensor type."""
    if file.has("general.file_type"):
        try:
            return (
                gguf.LlamaFileType(file.integer("general.file_type"))
                .name.removeprefix("MOSTLY_")
                .removeprefix("ALL_")
            )
        except ValueError:
            pass
    return Counter(file.tensor_type(name) for name in file.tensor_names).most_common(1)[0][0]
