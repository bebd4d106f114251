"""Builds the drafter a SpeculativeConfig names, for a loaded target model.

Heads (eagle, eagle3, mtp, dflash) load from `spec.model`, a folder with config.json and safetensors
in vLLM's names, or for the embedded target from the head shipped in refengine/heads; without either
they are randomly initialised from a fixed seed and the drafter says so
(`random_init`), which the engine logs and /metrics exposes.
"""

import dataclasses
import functools
from dataclasses import dataclass

from refengine.heads import shipped_head_path
from refengine.model.config import Numerics
from refengine.model.kv_cache import KVCache
from refengine.model.loader import LoadedModel, load_model
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.dflash import DFlashNetwork, DFlashProposer, build_target_layer_ids
from refengine.spec_decode.draft_model import DraftModelProposer, LayerStackNetwork
from refengine.spec_decode.eagle import Eagle3Network, EagleNetwork, default_eagle3_aux_layer_ids
from refengine.spec_decode.head_checkpoint import (
    HeadCheckpoint,
    HeadLoadError,
    head_model_config,
    load_head_weights,
    random_init,
    read_head_checkpoint,
)
from refengine.spec_decode.hidden_state_proposer import HiddenStateProposer
from refengine.spec_decode.mtp import MtpNetwork, first_mtp_layer
from refengine.spec_decode.ngram import NgramProposer
from refengine.spec_decode.proposer import Proposer
from refengine.spec_decode.target_view import TargetView

DraftNetwork = EagleNetwork | Eagle3Network | MtpNetwork | DFlashNetwork


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The target's paged KV geometry; a drafter's own KV uses the same block ids."""

    num_blocks: int
    block_size: int


def build_proposer(spec: SpeculativeConfig, target: LoadedModel, layout: KVLayout) -> Proposer:
    k = spec.num_speculative_tokens
    if spec.method == "ngram":
        return NgramProposer(k, spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec.method == "draft_model":
        network, max_positions = _draft_network(spec, target, layout)
        return DraftModelProposer(network, k, layout.block_size, max_positions)
    # Without a model path, the embedded target uses the head shipped in the package, if one ships.
    folder = spec.model if spec.model is not None else shipped_head_path(target, spec.method)
    checkpoint = None if folder is None else read_head_checkpoint(folder)
    head = build_network(spec, target, layout, checkpoint)
    max_positions = head.config.max_position_embeddings
    if isinstance(head, DFlashNetwork):
        return DFlashProposer(head, k, layout.block_size, max_positions, random_init=checkpoint is None)
    return HiddenStateProposer(
        head, spec.method, k, layout.block_size, max_positions, random_init=checkpoint is None
    )


def build_network(
    spec: SpeculativeConfig,
    target: LoadedModel,
    layout: KVLayout,
    checkpoint: HeadCheckpoint | None = None,
    *,
    numerics: Numerics | None = None,
) -> DraftNetwork:
    """The draft network `spec.method` names, for `target`, with its own paged KV in `layout`: head weights from
    `checkpoint`, else randomly initialised (seeded). `numerics` defaults to the target's (a trainer
    passes Numerics.FAST, whose ops are differentiable)."""
    model = target.model
    numerics = model.numerics if numerics is None else numerics
    dtype = model.embed_tokens.weight.dtype
    raw = {} if checkpoint is None else checkpoint.config
    origin = f"{spec.method} head" if checkpoint is None else str(checkpoint.folder)
    num_target_layers = target.config.num_hidden_layers
    # DeepSeek MTP checkpoints carry the whole model's config; the MTP module is one layer.
    config = head_model_config(
        target.config, raw, origin, num_hidden_layers=1 if spec.method == "mtp" else None
    )
    kv_cache = KVCache.allocate(config, layout.num_blocks, layout.block_size, dtype)
    view = TargetView(model)
    head: DraftNetwork
    if spec.method == "eagle":
        head = EagleNetwork(view, config, kv_cache, numerics, dtype)
        rename = EagleNetwork.parameter_name
    elif spec.method == "eagle3":
        eagle_config = raw.get("eagle_config") or {}
        aux = eagle_config.get("eagle_aux_hidden_state_layer_ids") or raw.get(
            "eagle_aux_hidden_state_layer_ids"
        )
        own_lm_head = None if checkpoint is None else checkpoint.tensors.get("lm_head.weight")
        head = Eagle3Network(
            view,
            config,
            kv_cache,
            tuple(aux) if aux else default_eagle3_aux_layer_ids(num_target_layers),
            num_target_layers,
            numerics,
            dtype,
            draft_vocab_size=None if own_lm_head is None else own_lm_head.shape[0],
        )
        rename = Eagle3Network.parameter_name
    elif spec.method == "mtp":
        head = MtpNetwork(view, config, kv_cache, numerics, dtype)
        first = None if checkpoint is None else first_mtp_layer(list(checkpoint.tensors))
        rename = functools.partial(MtpNetwork.parameter_name, first_layer=first)
    elif spec.method == "dflash":
        dflash_config = raw.get("dflash_config") or {}
        layer_ids = spec.target_layer_ids or tuple(
            dflash_config.get("target_layer_ids")
            or build_target_layer_ids(num_target_layers, config.num_hidden_layers)
        )
        if not all(0 <= i < num_target_layers for i in layer_ids):
            raise HeadLoadError(
                f"{origin}: target_layer_ids {list(layer_ids)} outside 0..{num_target_layers - 1}"
            )
        head = DFlashNetwork(
            view,
            config,
            kv_cache,
            layer_ids,
            _mask_token_id(spec, dflash_config, target, origin),
            numerics,
            dtype,
        )
        rename = DFlashNetwork.parameter_name
    else:
        raise ValueError(f"speculative method {spec.method!r} has no head")
    if checkpoint is None:
        random_init(head)
    else:
        load_head_weights(head, checkpoint.tensors, rename, head.checkpoint_name, origin)
        if isinstance(head, Eagle3Network):
            head.load_vocab_map(checkpoint.tensors, origin)
    return head


def _mask_token_id(spec: SpeculativeConfig, dflash_config: dict, target: LoadedModel, origin: str) -> int:
    """spec.mask_token_id, else the checkpoint's dflash_config.mask_token_id, else the tokenizer's first
    eos id: a token that never sits inside a committed context mid-sequence, so the block's mask rows
    cannot be mistaken for text (DFlash's own checkpoints name a reserved id in their config)."""
    mask = spec.mask_token_id
    if mask is None:
        mask = dflash_config.get("mask_token_id")
    if mask is None:
        if not target.tokenizer.eos_token_ids:
            raise HeadLoadError(f"{origin}: no mask_token_id configured and the tokenizer has no eos id")
        mask = target.tokenizer.eos_token_ids[0]
    if not 0 <= mask < target.config.vocab_size:
        raise HeadLoadError(
            f"{origin}: mask_token_id {mask} outside the vocabulary (0..{target.config.vocab_size - 1})"
        )
    return int(mask)


def _draft_network(
    spec: SpeculativeConfig, target: LoadedModel, layout: KVLayout
) -> tuple[LayerStackNetwork, int]:
    """A separate model (spec.model), or a self-draft: the target's first num_draft_layers layers."""
    dtype = target.model.embed_tokens.weight.dtype
    if spec.model is not None:
        draft = load_model(spec.model, dtype=dtype, numerics=target.model.numerics)
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(
                f"draft model {spec.model}: vocabulary of {draft.config.vocab_size} tokens, the target has "
                f"{target.config.vocab_size}"
            )
    elif spec.num_draft_layers is None:
        raise ValueError("draft_model needs 'model' (a draft model) or 'num_draft_layers' (a self-draft)")
    else:
        draft = target
    num_layers = spec.num_draft_layers or draft.config.num_hidden_layers
    if num_layers > draft.config.num_hidden_layers:
        raise ValueError(
            f"num_draft_layers={num_layers} exceeds the draft's {draft.config.num_hidden_layers} layers"
        )
    kv_config = dataclasses.replace(draft.config, num_hidden_layers=num_layers)
    kv_cache = KVCache.allocate(kv_config, layout.num_blocks, layout.block_size, dtype)
    return LayerStackNetwork(draft.model, num_layers, kv_cache), draft.config.max_position_embeddings
