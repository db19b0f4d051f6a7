"""The C++ packed linear kernel against a float64 product, and its packing and misuse."""

from __future__ import annotations

import pytest
import torch

from quire.kernels import packed_linear
from tests.hardware import needs_packed_linear
from tests.kernels.helpers import serial_and_parallel

DTYPES = [
    pytest.param(dtype, marks=needs_packed_linear(dtype))
    for dtype in (torch.float32, torch.bfloat16)
]
# (out_features, in_features): the default model's qkv and down, a width that is no multiple
# of the 64-column tile, one narrower than a tile, and the shortest even K.
SHAPES = [(960, 576), (576, 1536), (100, 64), (17, 96), (64, 2)]
# rows around the kernel's 6-row passes, and a prefill-sized batch
ROWS = [1, 5, 6, 7, 13, 64]


def _within_rounding(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> bool:
    # Exact products, float32 sums in some order, one rounding to the dtype: within one ulp of
    # the exact value plus float32's worst-case summation error over K terms.
    exact = x.double() @ weight.double().t()
    magnitude = x.double().abs() @ weight.double().abs().t()
    if bias is not None:
        exact = exact + bias.double()
        magnitude = magnitude + bias.double().abs()
    mantissa_bits = 7 if out.dtype == torch.bfloat16 else 23
    ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - mantissa_bits)
    sum_error = magnitude * (x.shape[1] + 1) * 2.0**-24
    return bool(((out.double() - exact).abs() <= ulp + sum_error).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_the_float64_product(
    dtype: torch.dtype, out_features: int, in_features: int, rows: int, with_bias: bool
) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + out_features)
    weight = torch.randn(out_features, in_features, generator=gen).to(dtype)
    bias = torch.randn(out_features, generator=gen).to(dtype) if with_bias else None
    packed = packed_linear.pack_weight(weight)
    num_tiles = -(-out_features // packed_linear.TILE_COLS)
    assert packed.shape[0] == num_tiles and packed.is_contiguous()
    wide = torch.randn(rows, 2 * in_features, generator=gen).to(dtype)
    for x in (wide[:, :in_features].contiguous(), wide[:, :in_features]):  # and a strided view
        out = packed_linear.packed_linear(x, packed, bias, out_features)
        assert out.dtype == dtype and out.shape == (rows, out_features)
        assert _within_rounding(out, x, weight, bias)
    assert torch.equal(
        packed_linear.packed_linear(wide[:, :in_features], packed, bias, out_features),
        packed_linear.packed_linear(wide[:, :in_features].contiguous(), packed, bias, out_features),
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_packing_pads_columns_with_zeros(dtype: torch.dtype) -> None:
    weight = torch.arange(1, 17 * 4 + 1, dtype=torch.float32).view(17, 4).to(dtype)
    packed = packed_linear.pack_weight(weight)
    if dtype == torch.bfloat16:
        # [tile, k / 2, 64 columns x 2 (k, k + 1)]
        assert packed.shape == (1, 2, 128)
        assert packed[0, 1, 2 * 3 : 2 * 3 + 2].tolist() == weight[3, 2:4].tolist()
        assert not packed[0, :, 2 * 17 :].any()
    else:
        assert packed.shape == (1, 4, 64)  # [tile, k, 64 columns]
        assert packed[0, 2, 3].item() == weight[3, 2].item()
        assert not packed[0, :, 17:].any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_result_does_not_depend_on_the_thread_count(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(960, 576, generator=gen).to(dtype)
    x = torch.randn(7, 576, generator=gen).to(dtype)
    packed = packed_linear.pack_weight(weight)
    serial, parallel = serial_and_parallel(
        lambda: packed_linear.packed_linear(x, packed, None, 960)
    )
    assert torch.equal(serial, parallel)


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_rows_give_an_empty_output(dtype: torch.dtype) -> None:
    packed = packed_linear.pack_weight(torch.ones(70, 8, dtype=dtype))
    out = packed_linear.packed_linear(torch.ones(0, 8, dtype=dtype), packed, None, 70)
    assert out.shape == (0, 70) and out.dtype == dtype


@needs_packed_linear(torch.float32)
def test_misuse_raises_value_error() -> None:
    weight = torch.ones(70, 8)
    packed = packed_linear.pack_weight(weight)
    with pytest.raises(ValueError, match="in_features"):
        packed_linear.packed_linear(torch.ones(2, 9), packed, None, 70)
    with pytest.raises(ValueError, match="out_features"):
        packed_linear.packed_linear(torch.ones(2, 8), packed, None, 200)
    with pytest.raises(ValueError, match="bias"):
        packed_linear.packed_linear(torch.ones(2, 8), packed, torch.ones(69), 70)
    with pytest.raises(ValueError, match="dtype"):
        packed_linear.packed_linear(torch.ones(2, 8), packed.to(torch.float64), None, 70)
    with pytest.raises(ValueError, match="float16"):
        packed_linear.pack_weight(weight.half())
    with pytest.raises(ValueError, match="even in_features"):
        packed_linear.pack_weight(torch.ones(4, 3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="float16"):
        packed_linear.packed_linear(torch.ones(2, 8, dtype=torch.float16), packed, None, 70)
