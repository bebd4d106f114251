"""The token-local primitives give each row a result that depends only on that row."""

import pytest
import torch

from refengine.model.config import Numerics
from refengine.model.layers import RotaryEmbedding
from refengine.model.ops import TILE_ROWS, linear, rms_norm, silu_and_mul


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize(("in_features", "out_features"), [(576, 960), (1536, 576), (64, 320), (37, 53)])
def test_tiled_linear_rows_ignore_batch_size_position_and_neighbours(
    in_features: int, out_features: int
) -> None:
    gen = torch.Generator().manual_seed(in_features)
    weight = torch.randn(out_features, in_features, generator=gen) / in_features**0.5
    x = torch.randn(3 * TILE_ROWS + 5, in_features, generator=gen)
    alone = torch.cat([linear(x[i : i + 1], weight, Numerics.BATCH_INVARIANT) for i in range(x.shape[0])])
    for num_rows in (2, TILE_ROWS - 1, TILE_ROWS + 1, x.shape[0]):
        assert torch.equal(
            _bits(linear(x[:num_rows], weight, Numerics.BATCH_INVARIANT)), _bits(alone[:num_rows])
        )
    shuffled = torch.randn_like(x)
    shuffled[5] = x[0]
    assert torch.equal(_bits(linear(shuffled, weight, Numerics.BATCH_INVARIANT)[5]), _bits(alone[0]))


def test_tiled_linear_matches_plain_matmul_closely() -> None:
    gen = torch.Generator().manual_seed(0)
    weight, x = torch.randn(70, 50, generator=gen), torch.randn(19, 50, generator=gen)
    torch.testing.assert_close(
        linear(x, weight, Numerics.BATCH_INVARIANT), x @ weight.T, rtol=1e-5, atol=1e-5
    )
    assert torch.equal(linear(x, weight, Numerics.FAST), torch.nn.functional.linear(x, weight))


@pytest.mark.parametrize("width", [64, 120, 576, 37])
def test_elementwise_and_norm_rows_ignore_the_tensor_around_them(width: int) -> None:
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(70, 2 * width, generator=gen)
    weight = torch.randn(2 * width, generator=gen)
    for op in (silu_and_mul, lambda t: rms_norm(t, weight, 1e-6)):
        whole = op(x)
        for num_rows in (1, 7, 33, 70):
            part = op(x[:num_rows].contiguous())
            assert torch.equal(_bits(part), _bits(whole[:num_rows]))


def test_primitives_match_their_textbook_definitions() -> None:
    gen = torch.Generator().manual_seed(1)
    x, weight = torch.randn(9, 48, generator=gen), torch.randn(24, generator=gen)
    gate, up = x.chunk(2, dim=-1)
    for numerics in Numerics:
        torch.testing.assert_close(silu_and_mul(x, numerics=numerics), torch.nn.functional.silu(gate) * up)
    y = x[:, :24]
    expected = weight * y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(rms_norm(y, weight, 1e-6), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_is_bitwise_the_textbook_rotate_half(dtype: torch.dtype) -> None:
    """The rotary table folds rotate_half's sign into sin and one gather serves queries and keys: the
    result is bit for bit `x * cos + rotate_half(x) * sin`, for q and k apart and side by side."""
    gen = torch.Generator().manual_seed(3)
    rotary = RotaryEmbedding(head_dim=64, max_positions=256, theta=10000.0, scaling=None)
    positions = torch.tensor([0, 5, 255, 64, 5])
    q, k = (torch.randn(5, heads, 64, generator=gen).to(dtype) for heads in (9, 3))
    cos, sin = rotary.cos[positions].unsqueeze(1), rotary.sin[positions].unsqueeze(1)

    def textbook(x: torch.Tensor) -> torch.Tensor:
        rotate_half = torch.cat([-x[..., 32:], x[..., :32]], dim=-1)
        return (x.float() * cos + rotate_half.float() * sin).to(dtype)

    got_q, got_k = rotary(positions, q, k)
    assert torch.equal(got_q, textbook(q)) and torch.equal(got_k, textbook(k))
    side_by_side = rotary.rotate(positions, torch.cat([q, k], dim=1))
    assert torch.equal(side_by_side, torch.cat([textbook(q), textbook(k)], dim=1))
