"""Writing small GGUF files the way llama.cpp's converter does, to test the loader against."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from refengine.model import LoadedModel
from refengine.model.weights import hf_state_dict

_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def llama_cpp_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """What llama.cpp's converter does to llama q/k rows: each head's two rotary halves interleaved."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, 2, rows // num_heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def gguf_name(hf_name: str) -> str:
    if hf_name in _TOP:
        return _TOP[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{_LAYER_NAMES[rest.removesuffix('.weight')]}.weight"


def write_gguf(
    loaded: LoadedModel,
    path: Path,
    *,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    arch: str | None = None,
    drop: str | None = None,
) -> Path:
    """The model as llama.cpp would convert it; 2-D weights stored as `qtype`, norms as F32."""
    config = loaded.config
    arch = arch or config.arch.value
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_file_type(
        int(
            gguf.LlamaFileType.ALL_F32
            if qtype == gguf.GGMLQuantizationType.F32
            else gguf.LlamaFileType.MOSTLY_Q8_0
        )
    )
    tokenizer = loaded.tokenizer
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if tokenizer.is_special(i) else 1 for i in range(len(tokens))])
    writer.add_token_merges([])
    writer.add_eos_token_id(tokenizer.eos_token_ids[0])
    writer.add_add_bos_token(False)
    if tokenizer.chat_template is not None:
        writer.add_chat_template(tokenizer.chat_template.source)
    for hf_name, tensor in hf_state_dict(loaded.model).items():
        name = gguf_name(hf_name)
        if name == drop:
            continue
        if config.arch.value == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_attention_heads if "attn_q" in name else config.num_key_value_heads
            tensor = llama_cpp_permute(tensor, heads)
        array = tensor.float().numpy()
        if array.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_single_tensor(path: Path, name: str, data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> Path:
    """A GGUF holding one (possibly pre-quantized) tensor and no model metadata."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor(name, data, raw_dtype=None if qtype == gguf.GGMLQuantizationType.F32 else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
