"""Linear layers over 32-weight blocks (reference_quantized's Q8_0, Q4_0, Q4_1, Q4_Z) in Triton,
for CUDA: a dequantize-GEMM whose weights stay in their blocks in device memory.

One program computes a BLOCK_M x BLOCK_N tile of the output: for each 32-input block of K it
loads the BLOCK_N weight rows' block bytes, dequantizes them in registers into float32 as the
oracle does (d * q, d * (q - 8), d * q + m, d * (q - z)), and multiplies them by the float32
activations with tl.dot (IEEE float32: no TF32 rounding). A decode step's few rows take one
BLOCK_M tile of 16 (tl.dot's least), so every weight byte is read once per step. The block's
float16 scale (and Q4_1's min) is read through a float16 view of the same bytes: every block
and row is an even number of bytes, so a block's first two bytes are one aligned float16.
Int8 activations are the C++ kernel's; here activations stay float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quire.kernels import reference_quantized

# Decided once, when the kernel is decorated: TRITON_INTERPRET=1 runs it on CPU tensors.
IS_INTERPRETED = bool(triton.knobs.runtime.interpret)

# FORMAT ids of the kernel, per block format
FORMAT_IDS = {"Q8_0": 0, "Q4_0": 1, "Q4_1": 2, "Q4_Z": 3}
BLOCK_N = 64
NUM_WARPS = 4


@triton.jit
def _quantized_linear_kernel(
    x_ptr,
    bytes_ptr,
    halves_ptr,
    out_ptr,
    num_rows,
    n_dim,
    k_blocks,
    row_bytes,
    stride_x_row,
    stride_out_row,
    FORMAT: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
    HEADER: tl.constexpr,  # bytes before a 4-bit block's nibbles
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, 32)
    m_mask = offs_m < num_rows
    n_mask = offs_n < n_dim
    rows = offs_n.to(tl.int64) * row_bytes  # [BLOCK_N] each weight row's first byte
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_x_row + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, k_blocks):
        block = rows + kb * BLOCK_BYTES  # [BLOCK_N] byte offsets of this K block
        d = tl.load(halves_ptr + block // 2, mask=n_mask, other=0.0).to(tl.float32)
        if FORMAT == 0:  # Q8_0: d, qs int8[32]
            raw = tl.load(
                bytes_ptr + block[None, :] + 2 + offs_k[:, None], mask=n_mask[None, :], other=0
            )
            w = raw.to(tl.int8, bitcast=True).to(tl.float32) * d[None, :]
        else:  # 4-bit: input j in the low nibble of byte j % 16 (j < 16), else the high one
            raw = tl.load(
                bytes_ptr + block[None, :] + HEADER + (offs_k[:, None] % 16),
                mask=n_mask[None, :],
                other=0,
            ).to(tl.int32)
            q = ((raw >> ((offs_k[:, None] // 16) * 4)) & 15).to(tl.float32)  # [32, BLOCK_N]
            if FORMAT == 1:  # Q4_0: d * (q - 8)
                w = d[None, :] * (q - 8.0)
            elif FORMAT == 2:  # Q4_1: d * q + m
                m = tl.load(halves_ptr + block // 2 + 1, mask=n_mask, other=0.0).to(tl.float32)
                w = d[None, :] * q + m[None, :]
            else:  # Q4_Z: d * (q - z), z the block's third byte
                z = tl.load(bytes_ptr + block + 2, mask=n_mask, other=0).to(tl.float32)
                w = d[None, :] * (q - z[None, :])
        x = tl.load(x_rows + kb * 32, mask=m_mask[:, None], other=0.0)
        acc += tl.dot(x, w, input_precision="ieee")
    out = out_ptr + offs_m[:, None].to(tl.int64) * stride_out_row + offs_n[None, :]
    tl.store(out, acc, mask=m_mask[:, None] & n_mask[None, :])


def supports(quant: str) -> bool:
    """Whether this kernel multiplies format `quant` (the 32-weight ones)."""
    return quant in FORMAT_IDS


def format_constants(quant: str) -> dict[str, int]:
    """The kernel's constexprs for format `quant`: its id, bytes per block, bytes before a
    4-bit block's nibbles."""
    fmt = reference_quantized.block_format(quant)
    header = 2 if quant in ("Q8_0", "Q4_0") else 4
    return {"FORMAT": FORMAT_IDS[quant], "BLOCK_BYTES": fmt.block_bytes, "HEADER": header}


def block_m(num_rows: int) -> int:
    """Rows of x per program: 16 (tl.dot's least) up to a decode batch, else 32 or 64."""
    return 16 if num_rows <= 16 else (32 if num_rows <= 32 else 64)


def quantized_linear(
    x: torch.Tensor,  # [num_tokens, in_features]
    blocks: torch.Tensor,  # [out_features, row_bytes] uint8, rows contiguous
    quant: str,
    int8_activations: bool = False,  # the C++ kernel's option; float32 here
) -> torch.Tensor:  # [num_tokens, out_features], x's dtype
    """x W^T with W in `blocks` (format `quant`, one of FORMAT_IDS), in float32."""
    if not supports(quant):
        raise ValueError(f"the Triton quantized linear runs {', '.join(FORMAT_IDS)}, not {quant}")
    fmt = reference_quantized.block_format(quant)
    num_rows, k_dim = x.shape
    n_dim = blocks.shape[0]
    if (
        blocks.dtype != torch.uint8
        or blocks.dim() != 2
        or not blocks.is_contiguous()
        or blocks.shape[1] != reference_quantized.row_bytes(quant, k_dim)
        or blocks.device != x.device
    ):
        raise ValueError(
            f"{quant} blocks must be a contiguous uint8 [out_features, "
            f"{k_dim // 32 * fmt.block_bytes}] tensor on {x.device}, got "
            f"{tuple(blocks.shape)} {blocks.dtype} on {blocks.device}"
        )
    x32 = x.float().contiguous()
    out = torch.empty(num_rows, n_dim, dtype=torch.float32, device=x.device)
    if num_rows == 0 or n_dim == 0:
        return out.to(x.dtype)
    tile_m = block_m(num_rows)
    grid = (triton.cdiv(num_rows, tile_m), triton.cdiv(n_dim, BLOCK_N))
    _quantized_linear_kernel[grid](
        x32,
        blocks,
        blocks.view(torch.float16),
        out,
        num_rows,
        n_dim,
        k_dim // 32,
        blocks.shape[1],
        x32.stride(0),
        out.stride(0),
        BLOCK_M=tile_m,
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS,
        **format_constants(quant),
    )
    return out if x.dtype == torch.float32 else out.to(x.dtype)
