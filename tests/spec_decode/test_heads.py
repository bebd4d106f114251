"""Head construction and loading: vLLM tensor names and config keys, clear errors on missing or
mis-shaped tensors, seeded random initialisation, and heads that a trainer can differentiate."""

import pytest
import torch

from refengine.model import KVCache, build_tiny_model
from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.model.config import Numerics
from refengine.model.layers import Linear
from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.dflash import build_target_layer_ids
from refengine.spec_decode.eagle import default_eagle3_aux_layer_ids, eagle3_capture_layers
from refengine.spec_decode.head_checkpoint import (
    HeadLoadError,
    head_state_dict,
    read_head_checkpoint,
    save_head,
)
from refengine.spec_decode.registry import KVLayout, build_network, build_proposer

LAYOUT = KVLayout(num_blocks=16, block_size=4)
HEAD_METHODS = ["eagle", "eagle3", "mtp", "dflash"]


def _save(head, folder, config=None):
    return save_head(head, config or {}, folder)


def _rewrite(folder, edit):
    """Apply `edit` to the checkpoint's tensor dict and write it back."""
    from safetensors.torch import save_file

    tensors = dict(read_head_checkpoint(folder).tensors)
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


@pytest.mark.parametrize("method", HEAD_METHODS)
def test_saved_head_loads_back_identically(tiny4, tmp_path, method):
    spec = SpeculativeConfig(method, 3)
    head = build_network(spec, tiny4, LAYOUT)
    _save(head, tmp_path)
    loaded = build_network(spec, tiny4, LAYOUT, read_head_checkpoint(tmp_path))
    assert head_state_dict(loaded).keys() == head_state_dict(head).keys()
    assert all(torch.equal(a, head_state_dict(loaded)[n]) for n, a in head_state_dict(head).items())
    drafter = build_proposer(SpeculativeConfig(method, 3, model=str(tmp_path)), tiny4, LAYOUT)
    assert drafter.random_init is False
    assert build_proposer(spec, tiny4, LAYOUT).random_init is True


def test_random_init_is_seeded(tiny4):
    spec = SpeculativeConfig("eagle", 3)
    a, b = (head_state_dict(build_network(spec, tiny4, LAYOUT)) for _ in range(2))
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_checkpoints_use_vllm_names(tiny4, tmp_path):
    eagle3 = build_network(SpeculativeConfig("eagle3", 3), tiny4, LAYOUT)
    names = set(read_head_checkpoint(_save(eagle3, tmp_path / "e3")).tensors)
    assert {
        "fc.weight",
        "norm.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.self_attn.q_proj.weight",
    } <= names
    assert {"midlayer.mlp.gate_proj.weight", "midlayer.input_layernorm.weight"} <= names
    dflash = build_network(SpeculativeConfig("dflash", 3), tiny4, LAYOUT)
    names = set(read_head_checkpoint(_save(dflash, tmp_path / "df")).tensors)
    assert {
        "fc.weight",
        "hidden_norm.weight",
        "layers.0.self_attn.q_norm.weight",
        "layers.0.self_attn.k_norm.weight",
    } <= names


def test_deepseek_mtp_layout_loads(tiny4, tmp_path):
    """DeepSeek names MTP layer i model.layers.{L + i}.*, repeats the embedding and lm_head per layer,
    and keeps the decoder layer's tensors directly under that prefix."""
    head = build_network(SpeculativeConfig("mtp", 3), tiny4, LAYOUT)
    folder = _save(head, tmp_path)
    vocab, hidden = tiny4.config.vocab_size, tiny4.config.hidden_size

    def deepseek(tensors):
        renamed = {f"model.layers.4.{n}": t for n, t in tensors.items()}
        renamed["model.layers.4.embed_tokens.weight"] = torch.zeros(vocab, hidden)
        renamed["model.layers.4.shared_head.head.weight"] = torch.zeros(vocab, hidden)
        renamed["model.layers.5.enorm.weight"] = torch.zeros(hidden)  # a second MTP layer: unused
        tensors.clear()
        tensors.update(renamed)

    _rewrite(folder, deepseek)
    assert "model.layers.4.self_attn.q_proj.weight" in read_head_checkpoint(folder).tensors
    loaded = build_network(SpeculativeConfig("mtp", 3), tiny4, LAYOUT, read_head_checkpoint(folder))
    assert all(torch.equal(t, head_state_dict(loaded)[n]) for n, t in head_state_dict(head).items())


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda t: t.pop("midlayer.self_attn.k_proj.weight"),
            "missing tensor 'midlayer.self_attn.k_proj.weight'",
        ),
        (
            lambda t: t.update({"fc.weight": torch.zeros(3, 3)}),
            "tensor 'fc.weight' has shape (3, 3), expected",
        ),
        (lambda t: t.update({"medusa.weight": torch.zeros(1)}), "unexpected tensor 'medusa.weight'"),
    ],
)
def test_bad_checkpoints_are_named(tiny4, tmp_path, edit, message):
    head = build_network(SpeculativeConfig("eagle3", 3), tiny4, LAYOUT)
    _rewrite(_save(head, tmp_path), edit)
    with pytest.raises(HeadLoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_network(SpeculativeConfig("eagle3", 3), tiny4, LAYOUT, read_head_checkpoint(tmp_path))


def test_checkpoint_config_must_match_the_target(tiny4, tmp_path):
    head = build_network(SpeculativeConfig("eagle", 3), tiny4, LAYOUT)
    _save(head, tmp_path, {"hidden_size": 128})
    with pytest.raises(HeadLoadError, match="hidden_size 128 differs from the target's 64"):
        build_network(SpeculativeConfig("eagle", 3), tiny4, LAYOUT, read_head_checkpoint(tmp_path))
    with pytest.raises(HeadLoadError, match="config.json"):
        read_head_checkpoint(tmp_path / "nowhere")


def test_eagle3_reduced_draft_vocabulary(tiny4, tmp_path):
    """An own lm_head over a draft vocabulary; d2t maps draft ids back to target ids."""
    head = build_network(SpeculativeConfig("eagle3", 3), tiny4, LAYOUT)
    draft_vocab, hidden = 40, tiny4.config.hidden_size
    lm_head = torch.randn(draft_vocab, hidden, generator=torch.Generator().manual_seed(1))
    d2t = torch.arange(draft_vocab) * 5  # draft id i is target id 6 i

    def own_vocab(tensors):
        tensors.update({"lm_head.weight": lm_head, "d2t": d2t})

    folder = _save(head, tmp_path)
    _rewrite(folder, own_vocab)
    loaded = build_network(SpeculativeConfig("eagle3", 3), tiny4, LAYOUT, read_head_checkpoint(folder))
    out = torch.randn(5, hidden, generator=torch.Generator().manual_seed(2))
    expected = (loaded.norm(out) @ lm_head.T).argmax(-1) * 6
    assert torch.equal(loaded.greedy_tokens(out), expected)
    _rewrite(folder, lambda t: t.update({"d2t": d2t + 1000}))
    with pytest.raises(HeadLoadError, match="outside the target vocabulary"):
        build_network(SpeculativeConfig("eagle3", 3), tiny4, LAYOUT, read_head_checkpoint(folder))
    _rewrite(folder, lambda t: t.pop("d2t"))
    with pytest.raises(HeadLoadError, match="no 'd2t' tensor"):
        build_network(SpeculativeConfig("eagle3", 3), tiny4, LAYOUT, read_head_checkpoint(folder))


def test_layer_choices():
    # DFlash: Qwen3-8B (36 layers) with a 5-layer head, as z-lab's checkpoints; a one-layer head reads the middle.
    assert build_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert build_target_layer_ids(30, 1) == (15,)
    # EAGLE3: vLLM's defaults name the layer whose input is captured; the runner captures outputs.
    assert eagle3_capture_layers(default_eagle3_aux_layer_ids(30), 30) == (1, 14, 26)
    with pytest.raises(HeadLoadError, match="eagle3 aux hidden-state layers"):
        eagle3_capture_layers(default_eagle3_aux_layer_ids(2), 2)


def test_dflash_options(tiny4):
    assert (
        build_network(SpeculativeConfig("dflash", 3), tiny4, LAYOUT).mask_token_id
        == tiny4.tokenizer.eos_token_ids[0]
    )
    spec = SpeculativeConfig("dflash", 3, mask_token_id=7, target_layer_ids=(0, 3))
    head = build_network(spec, tiny4, LAYOUT)
    assert (head.mask_token_id, head.capture_layers, head.fc.weight.shape[1]) == (7, (0, 3), 2 * 64)
    with pytest.raises(HeadLoadError, match="target_layer_ids"):
        build_network(SpeculativeConfig("dflash", 3, target_layer_ids=(4,)), tiny4, LAYOUT)


def test_draft_model_needs_a_model_or_a_layer_count(tiny4, tmp_path):
    with pytest.raises(ValueError, match="'model' .* or 'num_draft_layers'"):
        build_proposer(SpeculativeConfig("draft_model", 3), tiny4, LAYOUT)
    with pytest.raises(ValueError, match="num_draft_layers=5 exceeds"):
        build_proposer(SpeculativeConfig("draft_model", 3, num_draft_layers=5), tiny4, LAYOUT)


@pytest.mark.parametrize("method", HEAD_METHODS)
def test_heads_are_trainable(method):
    """With Numerics.FAST (plain differentiable torch ops) gradients reach every head parameter and no
    target parameter."""
    target = build_tiny_model("qwen3", seed=3, num_hidden_layers=4, numerics="fast")
    head = build_network(SpeculativeConfig(method, 3), target, LAYOUT)
    for p in head.parameters():
        p.requires_grad_(True)
    ids, positions = torch.tensor([5, 6, 7, 8]), torch.arange(4)
    meta = build_attention_metadata([0], [4], [[0, 1]], LAYOUT.block_size, causal=method != "dflash")
    with torch.no_grad():
        out = target.model(
            ids, positions, meta, KVCache.allocate(target.config, 16, 4), capture_layers=(0, 1, 2, 3)
        )
    if method == "dflash":
        head.store_context(
            head.combine(torch.cat([out.aux_hidden_states[i] for i in head.capture_layers], -1)),
            positions,
            meta,
        )
        ctx_meta = build_attention_metadata([4], [4], [[0, 1]], LAYOUT.block_size, causal=False)
        hidden = head.forward(ids, positions + 4, ctx_meta)
    else:
        layers = head.capture_layers
        features = torch.cat([out.aux_hidden_states[i] for i in layers], -1) if layers else out.hidden_states
        hidden = head.forward(ids, head.combine(features), positions, meta)
    norm = head.shared_head["norm"] if method == "mtp" else head.norm
    target.model.compute_logits(norm(hidden)).logsumexp(-1).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())
    assert all(p.grad is None for p in target.model.parameters())


@pytest.mark.parametrize("method", HEAD_METHODS)
def test_a_head_takes_the_targets_dtype_and_the_numerics_asked_for(method):
    """Every weight in the target's dtype (bf16 here, not the float32 default) and every projection
    with the numerics the caller chose (FAST, not the target's batch-invariant default)."""
    target = build_tiny_model("qwen3", seed=3, num_hidden_layers=4)
    target.model.to(torch.bfloat16)
    head = build_network(SpeculativeConfig(method, 3), target, LAYOUT, numerics=Numerics.FAST)
    assert {p.dtype for p in head.parameters()} == {torch.bfloat16}
    linears = [m for m in head.modules() if isinstance(m, Linear)]
    assert linears and {m.numerics for m in linears} == {Numerics.FAST}


def test_each_heads_layers_have_their_checkpoints_norms(tiny4):
    """EAGLE's first layer has no input norm and no q/k norms (its input is fc's output); DFlash's layers
    have both: a head missing one, or with an extra one, could not load its trained checkpoint."""
    eagle = set(head_state_dict(build_network(SpeculativeConfig("eagle", 3), tiny4, LAYOUT)))
    assert not any("input_layernorm" in n or "q_norm" in n or "k_norm" in n for n in eagle)
    assert "layers.0.post_attention_layernorm.weight" in eagle
    dflash = set(head_state_dict(build_network(SpeculativeConfig("dflash", 3), tiny4, LAYOUT)))
    assert {"layers.0.input_layernorm.weight", "layers.0.self_attn.q_norm.weight"} <= dflash
    # MTP's layer and EAGLE3's midlayer: an input norm, no q/k norms.
    mtp = set(head_state_dict(build_network(SpeculativeConfig("mtp", 3), tiny4, LAYOUT)))
    assert "layer.input_layernorm.weight" in mtp and not any("q_norm" in n or "k_norm" in n for n in mtp)
    eagle3 = set(head_state_dict(build_network(SpeculativeConfig("eagle3", 3), tiny4, LAYOUT)))
    assert not any("q_norm" in n or "k_norm" in n for n in eagle3)
