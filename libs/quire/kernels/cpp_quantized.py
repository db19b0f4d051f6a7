"""Linear layers over quantized blocks (reference_quantized's formats) in C++ on the CPU
(csrc/quantized_linear_cpu.cpp): each thread dequantizes tiles of the weight's rows into float32
and multiplies them by the activations with FMAs (float32 sums): 16 lanes in an x86-64-v4 build
(AVX-512), 8 in an x86-64-v3 one (AVX2, FMA, F16C); or, asked for int8 activations, quantizes
a few rows of x to int8 and multiplies them by 32-weight blocks in integers. The library is
cpp_attention's; in a build with neither nothing is supported and the oracle runs.
"""

from __future__ import annotations

import functools

import torch

from quire.kernels import cpp_attention, reference_quantized


@functools.cache
def _supports_type(ggml_type: int) -> bool:
    if not cpp_attention.is_available():
        return False
    return bool(torch.ops.quire_cpu.quantized_linear_supported(ggml_type))


def supports(quant: str, dtype: torch.dtype) -> bool:
    """Whether the C++ kernel runs format `quant` here (activations of any float dtype: they
    are multiplied in float32)."""
    try:
        fmt = reference_quantized.block_format(quant)
    except ValueError:
        return False
    return dtype.is_floating_point and _supports_type(fmt.ggml_type)


@functools.cache
def int8_row_limit() -> int:
    """int8 activations apply to calls of fewer rows of x than this (the kernel's choice)."""
    cpp_attention.require_loaded()
    return int(torch.ops.quire_cpu.quantized_linear_int8_rows())


def quantized_linear(
    x: torch.Tensor, blocks: torch.Tensor, quant: str, int8_activations: bool = False
) -> torch.Tensor:
    """x `[num_tokens, in_features]` times the dequantized weight in `blocks`, transposed; in
    x's dtype. With `int8_activations`, calls of fewer than `int8_row_limit()` rows against
    Q8_0, Q4_0 or Q4_1 quantize x to int8 per 32 inputs and multiply in integers
    (reference_quantized.quantized_linear_int8 is their oracle). Checks shapes and dtypes in
    C++."""
    fmt = reference_quantized.block_format(quant)
    cpp_attention.require_loaded()
    # (decode calls this ~4 times a layer: float32 activations go through without a cast)
    x32 = x if x.dtype == torch.float32 else x.float()
    if x32.stride(-1) != 1:
        x32 = x32.contiguous()
    out = torch.ops.quire_cpu.quantized_linear(x32, blocks, fmt.ggml_type, int8_activations)
    return out if x.dtype == torch.float32 else out.to(x.dtype)
