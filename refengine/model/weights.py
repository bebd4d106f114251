"""Checkpoint tensors (HF names) <-> this model's parameters, packing q/k/v and gate/up.

Every loader translates its file's names to HF's `model.layers.N.self_attn.q_proj.weight` spelling
first, so this is the only place that knows the packed layout:

    qkv_proj.weight     rows [0, q_size) = q_proj | [q_size, q_size + kv_size) = k_proj | rest = v_proj
    gate_up_proj.weight rows [0, intermediate) = gate_proj | [intermediate, 2 * intermediate) = up_proj
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from refengine.model.config import ModelConfig
from refengine.model.errors import ModelLoadError
from refengine.model.transformer import Transformer

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")

# HF suffix inside a layer -> (our suffix, shard name) for the packed projections.
_PACKED = {
    "self_attn.q_proj.weight": ("self_attn.qkv_proj.weight", "q"),
    "self_attn.k_proj.weight": ("self_attn.qkv_proj.weight", "k"),
    "self_attn.v_proj.weight": ("self_attn.qkv_proj.weight", "v"),
    "mlp.gate_proj.weight": ("mlp.gate_up_proj.weight", "gate"),
    "mlp.up_proj.weight": ("mlp.gate_up_proj.weight", "up"),
}
_PLAIN_LAYER = {
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
}
_TOP = {
    "model.embed_tokens.weight": "embed_tokens.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}
# Tensors some checkpoints carry that the model recomputes or does not use.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True, slots=True)
class _Target:
    param: str
    row_start: int
    row_end: int | None  # None: the whole parameter


def _shard_rows(config: ModelConfig, shard: str) -> tuple[int, int]:
    q, kv, inter = config.q_size, config.kv_size, config.intermediate_size
    return {
        "q": (0, q),
        "k": (q, q + kv),
        "v": (q + kv, q + 2 * kv),
        "gate": (0, inter),
        "up": (inter, 2 * inter),
    }[shard]


def _target(name: str, config: ModelConfig) -> _Target | None:
    if name in _TOP:
        if name == "lm_head.weight" and config.tie_word_embeddings:
            return None
        return _Target(_TOP[name], 0, None)
    match = _LAYER.match(name)
    if match is not None:
        layer, suffix = match.groups()
        if suffix in _PACKED:
            ours, shard = _PACKED[suffix]
            start, end = _shard_rows(config, shard)
            return _Target(f"layers.{layer}.{ours}", start, end)
        if suffix in _PLAIN_LAYER:
            return _Target(f"layers.{layer}.{suffix}", 0, None)
    if name.endswith(_IGNORED_SUFFIXES):
        return None
    raise ModelLoadError(f"unexpected tensor {name!r} for a {config.arch} model")


def load_weights(model: Transformer, tensors: Iterable[tuple[str, torch.Tensor]], origin: str) -> None:
    """Copy HF-named tensors into `model`; every parameter region must be filled."""
    params = dict(model.named_parameters())
    expected = _expected_regions(model)
    filled: set[tuple[str, int, int]] = set()
    for name, tensor in tensors:
        target = _target(name, model.config)
        if target is None:
            continue
        if target.param not in params:
            raise ModelLoadError(
                f"{origin}: tensor {name!r} has no place in a {model.config.num_hidden_layers}-layer model"
            )
        param = params[target.param]
        row_end = param.shape[0] if target.row_end is None else target.row_end
        region = param.data[target.row_start : row_end]
        if tuple(tensor.shape) != tuple(region.shape):
            raise ModelLoadError(
                f"{origin}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(region.shape)}"
            )
        region.copy_(tensor)
        filled.add((target.param, target.row_start, row_end))
    missing = [hf_name for region, hf_name in expected.items() if region not in filled]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"{origin}: missing tensor {missing[0]!r}{more}")


def _expected_regions(model: Transformer) -> dict[tuple[str, int, int], str]:
    """(parameter, first row, end row) -> the HF tensor that fills it."""
    config = model.config
    regions: dict[tuple[str, int, int], str] = {}
    for param_name, param in model.named_parameters():
        if not param_name.startswith("layers."):
            hf = next(hf for hf, ours in _TOP.items() if ours == param_name)
            regions[(param_name, 0, param.shape[0])] = hf
            continue
        layer, suffix = param_name.split(".", 2)[1:]
        shards = [(hf, shard) for hf, (ours, shard) in _PACKED.items() if ours == suffix]
        for hf_suffix, shard in shards:
            start, end = _shard_rows(config, shard)
            regions[(param_name, start, end)] = f"model.layers.{layer}.{hf_suffix}"
        if not shards:
            regions[(param_name, 0, param.shape[0])] = f"model.layers.{layer}.{suffix}"
    return regions


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under HF names, packed projections split back apart."""
    params = dict(model.named_parameters())
    return {
        hf: params[param].data[start:end].clone()
        for (param, start, end), hf in _expected_regions(model).items()
    }
