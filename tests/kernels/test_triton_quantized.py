"""The Triton dequantize-GEMM over 32-weight blocks (triton_quantized.py) against the torch
oracle, per format: interpreted on the CPU by default, compiled with --device cuda."""

from __future__ import annotations

import pytest
import torch

from quire.kernels import quantized, reference_quantized
from tests.kernels.helpers import random_blocks

FORMATS = ["Q8_0", "Q4_0", "Q4_1", "Q4_Z"]


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize(("rows", "out_features"), [(1, 67), (3, 6), (17, 64), (40, 130)])
def test_triton_matches_the_oracle(device: str, name: str, rows: int, out_features: int) -> None:
    from quire.kernels import triton_quantized

    in_features = 96  # three 32-blocks
    blocks = random_blocks(name, out_features, in_features, seed=rows)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(out_features))
    expected = reference_quantized.quantized_linear(x.double(), blocks, name)
    got = triton_quantized.quantized_linear(x.to(device), blocks.to(device), name).cpu()
    magnitude = x.double().abs() @ reference_quantized.dequantize(blocks, name).double().abs().t()
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    assert ((got.double() - expected).abs() <= magnitude * in_features * 2.0**-23).all()


def test_triton_returns_the_activations_dtype(device: str) -> None:
    from quire.kernels import triton_quantized

    blocks = random_blocks("Q4_1", 16, 64).to(device)
    x = torch.randn(2, 64).to(device=device, dtype=torch.bfloat16)
    got = triton_quantized.quantized_linear(x, blocks, "Q4_1")
    expected = reference_quantized.quantized_linear(x.cpu(), blocks.cpu(), "Q4_1")
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.cpu().float(), expected.float(), rtol=1e-2, atol=1e-2)


def test_triton_refuses_what_it_does_not_multiply(device: str) -> None:
    from quire.kernels import triton_quantized

    assert not triton_quantized.supports("Q4_K")
    with pytest.raises(ValueError, match="runs Q8_0, Q4_0, Q4_1, Q4_Z, not Q4_K"):
        triton_quantized.quantized_linear(
            torch.randn(1, 256), random_blocks("Q4_K", 2, 256), "Q4_K"
        )
    with pytest.raises(ValueError, match="contiguous uint8"):
        triton_quantized.quantized_linear(torch.randn(1, 64), torch.zeros(2, 40), "Q4_1")


def test_the_triton_backend_takes_32_weight_blocks(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the triton backend (CUDA's), 32-weight blocks take the Triton kernel and the
    K-quants the oracle."""
    from quire.kernels import triton_quantized

    monkeypatch.setenv("QUIRE_KERNEL_BACKEND", "triton")
    calls: list[str] = []
    original = triton_quantized.quantized_linear
    monkeypatch.setattr(
        triton_quantized,
        "quantized_linear",
        lambda x, blocks, quant: calls.append(quant) or original(x, blocks, quant),
    )
    for name in ("Q4_Z", "Q6_K"):
        blocks = random_blocks(name, 8, 256).to(device)
        x = torch.randn(2, 256).to(device)
        got = quantized.quantized_linear(x, blocks, name)
        expected = reference_quantized.quantized_linear(x.cpu().double(), blocks.cpu(), name)
        assert torch.allclose(got.cpu().double(), expected, rtol=1e-4, atol=1e-4)
    assert calls == ["Q4_Z"]
