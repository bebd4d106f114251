"""The token-local primitives give each row a result that depends only on that row."""

import pytest
import torch

from refengine.model.config import Numerics
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
