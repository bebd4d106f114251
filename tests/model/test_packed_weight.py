"""Fast numerics multiply by a packed copy of each weight on the CPU (packed_weight.py): only where it
applies, close to F.linear, and never from a stale copy."""

import copy

import pytest
import torch
import torch.nn.functional as F

from refengine.model import Numerics, build_tiny_model
from refengine.model.layers import Linear
from refengine.model.packed_weight import packing_available

pytestmark = pytest.mark.skipif(not packing_available(), reason="torch built without oneDNN")


def _linear(numerics: Numerics = Numerics.FAST) -> Linear:
    layer = Linear(24, 40, numerics, torch.float32)
    layer.weight.copy_(torch.randn(40, 24, generator=torch.Generator().manual_seed(1)))
    return layer


def _rows(n: int) -> torch.Tensor:
    return torch.randn(n, 24, generator=torch.Generator().manual_seed(2))


def test_several_rows_in_inference_mode_use_the_packed_copy() -> None:
    layer, x = _linear(), _rows(5)
    with torch.inference_mode():
        out = layer(x)
    assert layer.packed.num_calls == 1
    torch.testing.assert_close(out, F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["one row", "autograd", "batch-invariant"])
def test_the_packed_copy_stays_out_where_it_does_not_apply(case: str) -> None:
    layer = _linear(Numerics.BATCH_INVARIANT if case == "batch-invariant" else Numerics.FAST)
    x = _rows(1 if case == "one row" else 5)
    if case == "autograd":
        out = layer(x)  # oneDNN's product has no backward
    else:
        with torch.inference_mode():
            out = layer(x)
    assert layer.packed.num_calls == 0
    torch.testing.assert_close(out, F.linear(x, layer.weight))


def test_a_changed_weight_is_packed_again() -> None:
    layer, x = _linear(), _rows(5)
    with torch.inference_mode():
        layer(x)
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # in place: the same tensor, a new version
    with torch.inference_mode():
        in_place = layer(x)
    torch.testing.assert_close(in_place, F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    layer.weight.data = torch.ones(40, 24)  # another tensor
    with torch.inference_mode():
        replaced = layer(x)
    torch.testing.assert_close(replaced, F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)


def test_a_used_layer_can_be_deep_copied() -> None:
    layer, x = _linear(), _rows(5)
    with torch.inference_mode():
        out = layer(x)
        copied = copy.deepcopy(layer)
        assert torch.equal(copied(x), out)
    assert copied.packed.num_calls == 1


def test_tied_output_projection_uses_its_packed_copy() -> None:
    model = build_tiny_model("llama", seed=3, numerics="fast").model
    assert model.lm_head is None  # tied to the embedding
    hidden = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        logits = model.compute_logits(hidden)
    assert model.packed_tied_lm_head.num_calls == 1
    torch.testing.assert_close(logits, F.linear(hidden, model.embed_tokens.weight), rtol=1e-5, atol=1e-5)
