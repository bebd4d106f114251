"""Proposer head weights: a folder with config.json and safetensors, in vLLM's tensor names, or a seeded
random initialisation when there are none.

Checkpoints name the attention and MLP projections separately (q_proj, k_proj, v_proj, gate_proj,
up_proj) as HF and vLLM do; the head layers pack them into qkv_proj and gate_up_proj like the target,
so loading and saving split or fill row ranges of the packed parameters.
"""

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from refengine.model.config import ModelConfig
from refengine.model.errors import ModelLoadError

# Heads without weights start from this seed, so a run with random heads is reproducible.
HEAD_INIT_SEED = 0

# Per-layer dims a head checkpoint may set; the rest (vocab, rope scaling, arch) come from the target.
_CONFIG_KEYS = {
    "num_attention_heads": int,
    "num_key_value_heads": int,
    "head_dim": int,
    "intermediate_size": int,
    "num_hidden_layers": int,
    "rms_norm_eps": float,
    "rope_theta": float,
    "max_position_embeddings": int,
}


class HeadLoadError(ModelLoadError):
    """A head checkpoint cannot be loaded: the message names the file and the tensor or key."""


@dataclass(frozen=True)
class HeadCheckpoint:
    folder: Path
    config: dict
    tensors: dict[str, torch.Tensor]


@dataclass(frozen=True, slots=True)
class _Region:
    param: str
    row_start: int
    row_end: int


def read_head_checkpoint(path: str | Path) -> HeadCheckpoint:
    folder = Path(path)
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise HeadLoadError(f"{config_path}: cannot be read as JSON ({err})") from err
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise HeadLoadError(f"{folder}: no .safetensors file")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    tensors[name] = handle.get_tensor(name)
        except (OSError, RuntimeError, ValueError) as err:  # safetensors raises its own subclasses
            raise HeadLoadError(f"{file}: not a readable safetensors file ({err})") from err
    return HeadCheckpoint(folder, config, tensors)


def head_model_config(
    target: ModelConfig, raw: Mapping, origin: str, *, num_hidden_layers: int | None = None
) -> ModelConfig:
    """The head's layer dims: the target's, overridden by the keys the head's config.json sets. The
    hidden size must be the target's, since the head uses the target's embedding and lm_head. The
    layer count is `num_hidden_layers` if given, else the config's, else 1."""
    hidden = raw.get("hidden_size", target.hidden_size)
    if hidden != target.hidden_size:
        raise HeadLoadError(f"{origin}: hidden_size {hidden} differs from the target's {target.hidden_size}")
    overrides: dict = {"num_hidden_layers": 1}
    for key, kind in _CONFIG_KEYS.items():
        if key in raw:
            try:
                overrides[key] = kind(raw[key])
            except (TypeError, ValueError) as err:
                raise HeadLoadError(
                    f"{origin}: config key {key!r} is not {kind.__name__}: {raw[key]!r}"
                ) from err
    if num_hidden_layers is not None:
        overrides["num_hidden_layers"] = num_hidden_layers
    if "num_attention_heads" in overrides and "head_dim" not in raw:
        overrides["head_dim"] = hidden // overrides["num_attention_heads"]
    try:
        return dataclasses.replace(target, **overrides)
    except ModelLoadError as err:
        raise HeadLoadError(f"{origin}: {err}") from err


def random_init(module: nn.Module, seed: int = HEAD_INIT_SEED) -> None:
    """Norm weights 1, projections N(0, 1/fan_in) so activations stay near unit scale, seeded."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in module.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
        else:
            noise = torch.randn(param.shape, generator=generator)
            param.data.copy_((noise / math.sqrt(param.shape[-1])).to(param.dtype))


def load_head_weights(
    module: nn.Module,
    tensors: Mapping[str, torch.Tensor],
    parameter_name: Callable[[str], str | None],
    checkpoint_name: Callable[[str], str],
    origin: str,
) -> None:
    """Copy checkpoint tensors into `module`. `parameter_name` maps a checkpoint name to the module's
    spelling (None: a tensor the head does not use, such as a copy of the target's embedding) and
    `checkpoint_name` back, for naming a missing tensor as the checkpoint would. Every parameter region
    must be filled, with the right shape."""
    regions = _regions(module)
    params = dict(module.named_parameters())
    filled: set[str] = set()
    for name, tensor in tensors.items():
        ours = parameter_name(name)
        if ours is None:
            continue
        region = regions.get(ours)
        if region is None:
            raise HeadLoadError(f"{origin}: unexpected tensor {name!r}")
        target = params[region.param].data[region.row_start : region.row_end]
        if tuple(tensor.shape) != tuple(target.shape):
            raise HeadLoadError(
                f"{origin}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
            )
        target.copy_(tensor)
        filled.add(ours)
    missing = [name for name in regions if name not in filled]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise HeadLoadError(f"{origin}: missing tensor {checkpoint_name(missing[0])!r}{more}")


def head_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's weights, packed projections split back apart (q/k/v, gate/up)."""
    params = dict(module.named_parameters())
    state = {
        name: params[r.param].data[r.row_start : r.row_end].clone().contiguous()
        for name, r in _regions(module).items()
    }
    # Persistent buffers (EAGLE3's d2t vocabulary map) travel with the weights.
    state.update((name, t.clone()) for name, t in module.state_dict().items() if name not in params)
    return state


def save_head(head: nn.Module, config: Mapping, folder: str | Path, *, half: bool = False) -> Path:
    """config.json + model.safetensors under the head's checkpoint names, readable by
    read_head_checkpoint; `half` stores floating tensors in fp16 (the shipped heads are)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        head.checkpoint_name(name): t.half() if half and t.is_floating_point() else t
        for name, t in head_state_dict(head).items()
    }
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(dict(config), indent=2) + "\n")
    return folder


def _regions(module: nn.Module) -> dict[str, _Region]:
    """Checkpoint name -> the parameter rows it fills."""
    regions: dict[str, _Region] = {}
    for name, param in module.named_parameters():
        prefix, _, leaf = name.rpartition(".")
        owner, _, proj = prefix.rpartition(".")
        stem = f"{owner}." if owner else ""
        rows = param.shape[0]
        if proj == "qkv_proj":
            attn = module.get_submodule(owner)
            shards = [("q_proj", attn.q_size), ("k_proj", attn.kv_size), ("v_proj", attn.kv_size)]
        elif proj == "gate_up_proj":
            shards = [("gate_proj", rows // 2), ("up_proj", rows // 2)]
        else:
            regions[name] = _Region(name, 0, rows)
            continue
        start = 0
        for shard, size in shards:
            regions[f"{stem}{shard}.{leaf}"] = _Region(name, start, start + size)
            start += size
    return regions
