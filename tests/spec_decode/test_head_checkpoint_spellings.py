"""Head checkpoints as other tools write them: tensors under a "model." prefix and extra tensors the
head does not use (a copy of the target's embedding or lm_head, EAGLE3's t2d mask) must load to the
same weights; a d2t table is checked against the target vocabulary at its exact bound."""

import re

import pytest
import torch
from safetensors.torch import save_file

from refengine.spec_decode.config import SpeculativeConfig
from refengine.spec_decode.head_checkpoint import (
    HeadLoadError,
    head_state_dict,
    read_head_checkpoint,
    save_head,
)
from refengine.spec_decode.registry import KVLayout, build_network

LAYOUT = KVLayout(num_blocks=16, block_size=4)


def _rewrite(folder, edit):
    tensors = dict(read_head_checkpoint(folder).tensors)
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def _unused_copies(tiny4, method) -> dict[str, torch.Tensor]:
    """What a checkpoint may carry beside the head's own weights, which the head must skip."""
    vocab, hidden = tiny4.config.vocab_size, tiny4.config.hidden_size
    copies = {"model.embed_tokens.weight": torch.zeros(vocab, hidden)}
    if method == "eagle3":
        # t2d is the reverse vocabulary mask; without an own lm_head it is not used.
        copies["t2d"] = torch.ones(vocab, dtype=torch.bool)
    if method == "dflash":
        copies["lm_head.weight"] = torch.zeros(vocab, hidden)
    return copies


@pytest.mark.parametrize("method", ["eagle", "eagle3", "dflash"])
def test_model_prefix_and_unused_copies_load_to_the_same_weights(tiny4, tmp_path, method):
    spec = SpeculativeConfig(method, 3)
    head = build_network(spec, tiny4, LAYOUT)
    folder = save_head(head, {}, tmp_path)

    def vllm_spelling(tensors):
        renamed = {f"model.{n}": t for n, t in tensors.items()}
        renamed.update(_unused_copies(tiny4, method))
        tensors.clear()
        tensors.update(renamed)

    _rewrite(folder, vllm_spelling)
    loaded = build_network(spec, tiny4, LAYOUT, read_head_checkpoint(folder))
    want, got = head_state_dict(head), head_state_dict(loaded)
    assert want.keys() == got.keys()
    assert all(torch.equal(want[n], got[n]) for n in want)


def _eagle3_with_own_vocab(tiny4, tmp_path, d2t):
    head = build_network(SpeculativeConfig("eagle3", 3), tiny4, LAYOUT)
    folder = save_head(head, {}, tmp_path)
    lm_head = torch.zeros(40, tiny4.config.hidden_size)  # a draft vocabulary of 40 ids
    _rewrite(folder, lambda t: t.update({"lm_head.weight": lm_head, "d2t": d2t}))
    return build_network(SpeculativeConfig("eagle3", 3), tiny4, LAYOUT, read_head_checkpoint(folder))


def test_d2t_reaching_the_last_target_id_loads_and_one_past_is_refused(tiny4, tmp_path):
    last = tiny4.config.vocab_size - 1
    d2t = torch.zeros(40, dtype=torch.long)
    d2t[-1] = last - 39  # draft id 39 -> target id vocab_size - 1: inside
    loaded = _eagle3_with_own_vocab(tiny4, tmp_path / "in", d2t)
    assert torch.equal(loaded.d2t, d2t)
    d2t[-1] += 1  # draft id 39 -> target id vocab_size: one past the end
    with pytest.raises(HeadLoadError, match=r": 'd2t' maps draft ids outside the target vocabulary$"):
        _eagle3_with_own_vocab(tiny4, tmp_path / "out", d2t)


def test_d2t_of_another_length_is_refused_naming_both_shapes(tiny4, tmp_path):
    folder = tmp_path / "short"
    expected = f"{folder}: tensor 'd2t' has shape (39,), expected (40,)"
    with pytest.raises(HeadLoadError, match=f"^{re.escape(expected)}$"):
        _eagle3_with_own_vocab(tiny4, folder, torch.zeros(39, dtype=torch.long))
