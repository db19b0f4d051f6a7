"""Packed linears (signatures.PackedLinear) in C++ on the CPU (csrc/linear_cpu.cpp), float32
(AVX-512 or AVX2 FMAs) or bfloat16 (AVX512_BF16 dot products, or on a CPU without AVX-512
bfloat16 pairs widened to float32 for AVX2 FMAs), and the packing of their weights.

A packed weight is `[ceil(N / 64), K, 64]` (float32) or `[ceil(N / 64), K / 2, 128]`
(bfloat16, pairs along K interleaved), N padded with zero columns: tiles of 64 output columns,
each one contiguous stream of the weights its columns need at every step along K. See the
C++ file for why. Whether they run for a call is quire.kernels.backends' rule (`packed_linear`).
"""

from __future__ import annotations

import functools

import torch

from quire.kernels import cpp_attention

TILE_COLS = 64  # output columns per packed tile


@functools.cache
def cpu_supports(dtype: torch.dtype) -> bool:
    """Whether the kernel can run in this dtype here: the C++ library is loaded and this CPU has
    the instructions (AVX2 and FMA; on a CPU with AVX-512, bfloat16 needs AVX512_BF16)."""
    if dtype not in (torch.float32, torch.bfloat16) or not cpp_attention.is_available():
        return False
    return bool(torch.ops.quire_cpu.packed_linear_supported(dtype))


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """The packed layout of a `[out_features, in_features]` float32 or bfloat16 CPU weight
    (bfloat16: in_features even)."""
    if weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(
            f"pack_weight takes a 2-d CPU weight, got {tuple(weight.shape)} on {weight.device}"
        )
    if weight.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"packed linears take float32 or bfloat16, not {weight.dtype}")
    n, k = weight.shape
    if weight.dtype == torch.bfloat16 and k % 2:
        raise ValueError(f"bfloat16 packed linears need an even in_features, got {k}")
    num_tiles = -(-n // TILE_COLS)
    padded = weight.new_zeros(num_tiles * TILE_COLS, k)
    padded[:n] = weight
    if weight.dtype == torch.bfloat16:
        # [tiles, 64 cols, K/2, 2] -> [tiles, K/2, 64 cols, 2]
        tiles = padded.view(num_tiles, TILE_COLS, k // 2, 2).permute(0, 2, 1, 3)
        return tiles.reshape(num_tiles, k // 2, 2 * TILE_COLS).contiguous()
    # [tiles, 64 cols, K] -> [tiles, K, 64 cols]
    return padded.view(num_tiles, TILE_COLS, k).permute(0, 2, 1).contiguous()


def packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """The kernel; an x whose last stride is not 1 is copied contiguous first."""
    if not cpu_supports(x.dtype):
        raise ValueError(f"packed linears do not run here in {x.dtype}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    return torch.ops.quire_cpu.packed_linear(x, packed, bias, out_features)
