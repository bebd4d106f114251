"""Reading an HF model folder: config.json plus one or several safetensors files."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from refengine.model.config import Arch, Llama3RopeScaling, ModelConfig
from refengine.model.errors import ModelLoadError

_ARCHES = {"llama": Arch.LLAMA, "qwen3": Arch.QWEN3}


@dataclass(frozen=True, slots=True)
class HfCheckpoint:
    folder: Path
    config: ModelConfig
    eos_token_ids: tuple[int, ...]
    files: tuple[Path, ...]
    weight_type: str

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for path in self.files:
            with _open(path) as handle:
                for name in handle.keys():
                    try:
                        tensor = handle.get_tensor(name)
                    except Exception as err:
                        raise ModelLoadError(f"{path}: tensor {name!r} cannot be read ({err})") from err
                    yield name, tensor


def _open(path: Path):  # safetensors does not export its handle type
    try:
        return safe_open(str(path), framework="pt")
    except Exception as err:  # safetensors raises its own error type, or OSError
        raise ModelLoadError(f"{path}: not a readable safetensors file ({err})") from err


def read_hf_folder(folder: Path) -> HfCheckpoint:
    raw = _read_json(folder / "config.json")
    config = _parse_config(raw, folder / "config.json")
    files = _weight_files(folder)
    dtypes: Counter[str] = Counter()
    for path in files:
        with _open(path) as handle:
            for name in handle.keys():
                dtypes[handle.get_slice(name).get_dtype()] += 1
    eos = raw.get("eos_token_id")
    generation_path = folder / "generation_config.json"
    if generation_path.exists():
        eos = _read_json(generation_path).get("eos_token_id", eos)
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    return HfCheckpoint(
        folder=folder,
        config=config,
        eos_token_ids=eos_ids,
        files=files,
        weight_type=dtypes.most_common(1)[0][0] if dtypes else "none",
    )


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"{path}: cannot be read as JSON ({err})") from err


def _weight_files(folder: Path) -> tuple[Path, ...]:
    single = folder / "model.safetensors"
    if single.exists():
        return (single,)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index}: has no 'weight_map'")
        files = tuple(folder / name for name in dict.fromkeys(weight_map.values()))
        for path in files:
            if not path.exists():
                raise ModelLoadError(f"{index}: names shard {path.name!r}, which does not exist")
        return files
    raise ModelLoadError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def _parse_config(raw: dict, path: Path) -> ModelConfig:
    model_type = raw.get("model_type")
    arch = _ARCHES.get(str(model_type))
    if arch is None:
        raise ModelLoadError(
            f"{path}: unsupported architecture {model_type!r} (supported: {', '.join(_ARCHES)})"
        )
    for flag in ("attention_bias", "mlp_bias"):
        if raw.get(flag):
            raise ModelLoadError(f"{path}: {flag}=true is not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{path}: hidden_act {raw['hidden_act']!r} is not supported (only silu)")
    try:
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        rope = raw.get("rope_parameters") or {}
        return ModelConfig(
            arch=arch,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw["rms_norm_eps"]),
            rope_theta=float(raw.get("rope_theta", rope.get("rope_theta", 10000.0))),
            max_position_embeddings=int(raw["max_position_embeddings"]),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            rope_scaling=_rope_scaling(raw.get("rope_scaling") or rope, path),
        )
    except KeyError as err:
        raise ModelLoadError(f"{path}: missing key {err.args[0]!r}") from err


def _rope_scaling(raw: dict, path: Path) -> Llama3RopeScaling | None:
    kind = raw.get("rope_type", raw.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise ModelLoadError(f"{path}: rope scaling {kind!r} is not supported (only llama3)")
    return Llama3RopeScaling(
        factor=float(raw["factor"]),
        low_freq_factor=float(raw["low_freq_factor"]),
        high_freq_factor=float(raw["high_freq_factor"]),
        original_max_position_embeddings=int(raw["original_max_position_embeddings"]),
    )
