"""Training a drafter head on a distillation set: seeded, deterministic, on the target's device.

The target stays frozen (its embedding and lm_head are borrowed through the head's TargetView);
only the head's own parameters train, with AdamW, a linear warmup, cosine decay and gradient
clipping. Data order, anchor choice and the head's initialisation all come from the seed.
"""

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from refengine.model.config import Kernels, ModelConfig, Numerics
from refengine.model.kv_cache import KVCache
from refengine.model.layers import set_kernels
from refengine.model.loaded_model import LoadedModel
from refengine.spec_decode.dflash import DFlashNetwork, build_target_layer_ids
from refengine.spec_decode.eagle import Eagle3Network, EagleNetwork, default_eagle3_aux_layer_ids
from refengine.spec_decode.head_checkpoint import head_model_config, random_init, save_head
from refengine.spec_decode.mtp import MtpNetwork
from refengine.spec_decode.target_view import TargetView
from refengine.train.batches import batch_stream
from refengine.train.data import DistillSet
from refengine.train.objectives import (
    RECIPES,
    Shortlist,
    choose_anchors,
    dflash_loss,
    feature_names,
    hidden_head_loss,
)

METHODS = ("eagle", "eagle3", "mtp", "dflash")
MAX_SEQ_LEN = 512


@dataclass(frozen=True)
class TrainConfig:
    method: str
    steps: int = 400
    seed: int = 0
    lr: float = 1e-3
    batch_tokens: int = 512
    warmup: float = 0.05  # share of the steps
    weight_decay: float = 0.0
    clip: float = 1.0
    num_layers: int = 1  # eagle and dflash; eagle3 and mtp heads have one
    anchors: int = 16  # dflash blocks per sequence and step
    shortlist: int = 4096  # tokens the losses score
    passes: int | None = None  # None: the method's recipe
    extra: dict = field(default_factory=dict)


def head_config(method: str, target: ModelConfig, cfg: TrainConfig, mask_token_id: int | None) -> dict:
    """config.json of a new head, in vLLM's keys: the target's layer dims, the head's layer count and
    the method's own block."""
    layers = cfg.num_layers if method in ("eagle", "dflash") else 1
    config = {
        "architectures": [
            {
                "eagle": "EagleLlamaForCausalLM",
                "eagle3": "Eagle3LlamaForCausalLM",
                "mtp": "DeepSeekMTPModel",
                "dflash": "DFlashDraftModel",
            }[method]
        ],
        "model_type": method,
        "hidden_size": target.hidden_size,
        "intermediate_size": target.intermediate_size,
        "num_hidden_layers": layers,
        "num_attention_heads": target.num_attention_heads,
        "num_key_value_heads": target.num_key_value_heads,
        "head_dim": target.head_dim,
        "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": target.rope_theta,
        "max_position_embeddings": target.max_position_embeddings,
        "vocab_size": target.vocab_size,
        "torch_dtype": "float16",
    }
    if method == "eagle3":
        config["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": list(default_eagle3_aux_layer_ids(target.num_hidden_layers))
        }
    if method == "mtp":
        config["num_nextn_predict_layers"] = 1
    if method == "dflash":
        config["block_size"] = (cfg.passes or RECIPES["dflash"].passes) + 1
        config["dflash_config"] = {
            "mask_token_id": mask_token_id,
            "target_layer_ids": list(build_target_layer_ids(target.num_hidden_layers, 3)),
        }
    return config


def new_head(method: str, loaded: LoadedModel, config: dict):
    """A head shaped by `config`, as the spec registry would build it from a checkpoint with this
    config.json, on fast (differentiable) numerics."""
    dims = head_model_config(
        loaded.config, config, f"new {method} head", num_hidden_layers=1 if method == "mtp" else None
    )
    kv = KVCache.allocate(dims, 1, 16)
    view = TargetView(loaded.model)
    fast = Numerics.FAST
    if method == "eagle":
        return EagleNetwork(view, dims, kv, fast)
    if method == "eagle3":
        aux = tuple(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
        return Eagle3Network(view, dims, kv, aux, loaded.config.num_hidden_layers, fast)
    if method == "mtp":
        return MtpNetwork(view, dims, kv, fast)
    block = config["dflash_config"]
    return DFlashNetwork(view, dims, kv, tuple(block["target_layer_ids"]), block["mask_token_id"], fast)


def required_features(method: str, loaded: LoadedModel, cfg: TrainConfig) -> list[str]:
    mask = loaded.tokenizer.eos_token_ids[0] if loaded.tokenizer.eos_token_ids else 0
    return feature_names(new_head(method, loaded, head_config(method, loaded.config, cfg, mask)))


def _lr(cfg: TrainConfig, step: int) -> float:
    warm = max(1, round(cfg.warmup * cfg.steps))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass(frozen=True)
class Resume:
    """Where a run keeps its checkpoint and when it must stop: a run that reaches `deadline` (a
    time.monotonic value) saves its state to `path` and returns unfinished; the same call again
    continues from there, with the same RNG and data-order state, to the same head."""

    path: Path
    deadline: float | None = None
    pause_at: int | None = None  # or stop at this step
    every: int = 500  # steps between checkpoints, so a killed run loses little


def _checkpoint_state(step, head, optimizer, anchor_rng, history, cfg, data_digest) -> dict:
    return {
        "step": step,
        "config": asdict(cfg),
        "data": data_digest,
        "head": {k: v.detach().cpu() for k, v in head.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "anchor_rng": anchor_rng.get_state(),
        "history": history,
    }


def _save_checkpoint(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def _load_checkpoint(path: Path, cfg: TrainConfig, data_digest: str) -> dict | None:
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state["config"] != asdict(cfg) or state["data"] != data_digest:
        raise ValueError(
            f"{path}: a checkpoint of another run (other options or data); remove it or choose another --out"
        )
    return state


def train_head(
    loaded: LoadedModel,
    data: DistillSet,
    cfg: TrainConfig,
    *,
    log: Callable[[str], None] = print,
    resume: Resume | None = None,
    data_digest: str = "",
) -> tuple[torch.nn.Module, dict, dict]:
    """Returns the head (float32, on the target's device), its config.json and a training summary
    (summary["finished"] is False when the run stopped at resume.deadline)."""
    if cfg.method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {cfg.method!r}")
    torch.manual_seed(cfg.seed)
    recipe = RECIPES[cfg.method]
    if cfg.passes is not None:
        recipe = type(recipe)(**{**asdict(recipe), "passes": cfg.passes})
    mask = loaded.tokenizer.eos_token_ids[0] if loaded.tokenizer.eos_token_ids else 0
    config = head_config(cfg.method, loaded.config, cfg, mask)
    head = new_head(cfg.method, loaded, config)
    # The fused Triton ops (CUDA) have no backward: training runs the reference torch ops.
    set_kernels(head, Kernels("reference", fused_ops=False))
    random_init(head, cfg.seed)
    model = loaded.model
    device = model.embed_tokens.weight.device
    head.to(device)
    params = list(head.parameters())
    for param in params:
        param.requires_grad_(True)
    vocab_weight = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    shortlist = Shortlist.of(data.tokens, vocab_weight, cfg.shortlist)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    anchor_rng = torch.Generator().manual_seed(cfg.seed + 1)
    history: list[dict[str, float]] = []
    first = 0
    state = _load_checkpoint(resume.path, cfg, data_digest) if resume else None
    if state is not None:
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        anchor_rng.set_state(state["anchor_rng"])
        history, first = state["history"], state["step"]
        log(f"train: resumed {resume.path} at step {first}")
    pad = recipe.passes + 1
    # One batch per step: the data order resumes at the step count.
    stream = batch_stream(
        data, feature_names(head), cfg.batch_tokens, MAX_SEQ_LEN, pad, cfg.seed, start=first
    )
    num_params = sum(p.numel() for p in params)
    log(
        f"train: {cfg.method} head, {num_params / 1e6:.2f}M parameters, {cfg.steps} steps, "
        f"shortlist of {len(shortlist.weight)} tokens ({shortlist.coverage(data.tokens):.1%} of the data), "
        f"on {device}"
    )
    # On a GPU the head's matrix products run in bfloat16 (parameters and optimizer stay float32).
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    start = time.monotonic()
    every = max(1, cfg.steps // 40)
    step = first
    while step < cfg.steps:
        if resume and (
            (resume.deadline is not None and time.monotonic() >= resume.deadline) or step == resume.pause_at
        ):
            break
        for group in optimizer.param_groups:
            group["lr"] = _lr(cfg, step)
        batch = next(stream)
        with autocast:
            if isinstance(head, DFlashNetwork):
                anchors, real = choose_anchors(batch, cfg.anchors, recipe.passes, anchor_rng)
                loss, metrics = dflash_loss(head, batch, recipe, shortlist, anchors, real, recipe.passes)
            else:
                loss, metrics = hidden_head_loss(head, batch, recipe, shortlist)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        optimizer.step()
        history.append(metrics)
        step += 1
        if step % every == 0 or step == cfg.steps:
            recent = history[-every:]
            mean = {k: sum(m[k] for m in recent) / len(recent) for k in recent[0]}
            elapsed = time.monotonic() - start
            shown = "  ".join(f"{k} {v:.3f}" for k, v in mean.items())
            log(
                f"train: step {step}/{cfg.steps}  {shown}  {elapsed:.0f}s "
                f"(eta {elapsed / (step - first) * (cfg.steps - step):.0f}s)"
            )
        if resume and step % resume.every == 0 and step < cfg.steps:
            _save_checkpoint(
                resume.path, _checkpoint_state(step, head, optimizer, anchor_rng, history, cfg, data_digest)
            )
    finished = step >= cfg.steps
    if resume and not finished:
        _save_checkpoint(
            resume.path, _checkpoint_state(step, head, optimizer, anchor_rng, history, cfg, data_digest)
        )
        log(f"train: stopped at step {step}/{cfg.steps}; saved {resume.path} (run the same command to go on)")
    for param in params:
        param.requires_grad_(False)
    summary = {
        "seconds": round(time.monotonic() - start, 1),
        "final": history[-1] if history else {},
        "finished": finished,
        "step": step,
    }
    return head, config, summary


def save_trained_head(head: torch.nn.Module, config: dict, folder: Path, training: dict) -> Path:
    """config.json (with a "training" record) + model.safetensors in fp16 under the checkpoint names
    the spec loader reads + COMMAND, the line that made it."""
    save_head(head.cpu(), {**config, "training": training}, folder, half=True)
    (folder / "COMMAND").write_text(training.get("command", "") + "\n")
    return folder
