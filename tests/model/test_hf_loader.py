"""HF folders: config.json + safetensors (single or sharded), and clear errors for bad ones."""

import json
from pathlib import Path

import pytest
import torch
from model_drive import prefill_logits
from safetensors.torch import load_file, save_file

from refengine.model import LoadedModel, ModelLoadError, build_tiny_model, load_model, save_hf_folder


@pytest.fixture
def tiny_folder(tmp_path: Path) -> tuple[LoadedModel, Path]:
    model = build_tiny_model("qwen3", seed=8)
    return model, save_hf_folder(model, tmp_path / "tiny")


def test_saved_folder_loads_bit_for_bit(tiny_folder: tuple[LoadedModel, Path]) -> None:
    original, folder = tiny_folder
    loaded = load_model(folder)
    assert loaded.config == original.config
    assert (loaded.source.format, loaded.source.weight_type, loaded.source.arch) == ("hf", "F32", "qwen3")
    ids = list(range(10, 50))
    assert torch.equal(prefill_logits(original.model, ids), prefill_logits(loaded.model, ids))
    assert loaded.tokenizer.eos_token_ids == original.tokenizer.eos_token_ids
    assert loaded.tokenizer.encode("a ☃ b") == original.tokenizer.encode("a ☃ b")


def test_sharded_checkpoint_loads(tiny_folder: tuple[LoadedModel, Path]) -> None:
    original, folder = tiny_folder
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, str(folder / shard))
    weight_map = {n: shard for shard, shard_names in shards.items() for n in shard_names}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = load_model(folder)
    assert torch.equal(prefill_logits(original.model, [1, 2, 3]), prefill_logits(loaded.model, [1, 2, 3]))


def test_truncated_safetensors_names_the_file(tiny_folder: tuple[LoadedModel, Path]) -> None:
    _, folder = tiny_folder
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=f"{weights}: not a readable safetensors file"):
        load_model(folder)


def _edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_unknown_architecture_is_named(tiny_folder: tuple[LoadedModel, Path]) -> None:
    _, folder = tiny_folder
    _edit_config(folder, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ModelLoadError, match="config.json: unsupported architecture 'gpt2'"):
        load_model(folder)


def test_missing_config_key_is_named(tiny_folder: tuple[LoadedModel, Path]) -> None:
    _, folder = tiny_folder
    path = folder / "config.json"
    config = json.loads(path.read_text())
    del config["intermediate_size"]
    path.write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="missing key 'intermediate_size'"):
        load_model(folder)


def test_missing_and_misshapen_tensors_are_named(tiny_folder: tuple[LoadedModel, Path]) -> None:
    _, folder = tiny_folder
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    k_proj = tensors.pop("model.layers.1.self_attn.k_proj.weight")
    save_file(tensors, str(path))
    with pytest.raises(ModelLoadError, match=r"missing tensor 'model\.layers\.1\.self_attn\.k_proj\.weight'"):
        load_model(folder)
    tensors["model.layers.1.self_attn.k_proj.weight"] = k_proj[:-1]
    save_file(tensors, str(path))
    with pytest.raises(ModelLoadError, match=r"k_proj\.weight' has shape \(31, 64\), expected \(32, 64\)"):
        load_model(folder)


def test_folder_without_weights_is_rejected(tmp_path: Path, tiny_folder: tuple[LoadedModel, Path]) -> None:
    _, folder = tiny_folder
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        load_model(folder)


def test_llama3_rope_scaling_is_read_and_unknown_scaling_rejected(tmp_path: Path) -> None:
    folder = save_hf_folder(build_tiny_model("llama"), tmp_path / "llama")
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    _edit_config(folder, rope_scaling=scaling)
    assert load_model(folder).config.rope_scaling is not None
    _edit_config(folder, rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ModelLoadError, match="rope scaling 'yarn' is not supported"):
        load_model(folder)
