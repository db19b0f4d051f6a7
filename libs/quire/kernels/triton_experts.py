"""The expert MLPs (reference_experts.expert_mlp's signature) in Triton: a grouped GEMM over
the (token, expert) pairs sorted by expert, in the shape of vLLM's fused MoE kernel.

The host aligns the sorted pairs to blocks of BLOCK_M rows that each belong to one expert
(padding entries point past the last pair), so one program computes a BLOCK_M x BLOCK_N tile of
one expert's product, gathering its A rows through the sorted pair ids and writing them back to
the pairs' own rows. Two launches: gate/up from the tokens' rows, then down from the activated
pairs' rows with each row scaled by its router weight; the top-k rows of a token are summed in
float32 and rounded once. The alignment is sized by an upper bound, so nothing syncs with the
device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quire.kernels import checks
from quire.kernels.reference_experts import activate, check_expert_mlp, group_by_expert
from quire.kernels.signatures import ClampedSwiGLU
from quire.kernels.triton_attention import _dot_precision as dot_precision

# Decided once, when the kernels are decorated: TRITON_INTERPRET=1 runs them on CPU tensors.
IS_INTERPRETED = bool(triton.knobs.runtime.interpret)

BLOCK_M = 16  # pair rows per tile; an expert's rows are padded to a multiple of it
BLOCK_N = 64
BLOCK_K = 32


@triton.jit
def _expert_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    weights_ptr,
    sorted_pairs_ptr,
    block_experts_ptr,
    num_pairs,
    n_dim,
    k_dim,
    stride_a_row,
    stride_a_col,
    stride_b_expert,
    stride_b_k,
    stride_b_n,
    stride_c_row,
    stride_c_col,
    TOP_K: tl.constexpr,
    A_ROWS_ARE_TOKENS: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FLOAT32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # One program per (block of BLOCK_M sorted pairs, tile of BLOCK_N output columns). A block
    # past the aligned pairs has expert -1 and does nothing.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_pairs_ptr + offs_m)  # padding entries hold num_pairs
    is_pair = pairs < num_pairs
    a_rows = pairs // TOP_K if A_ROWS_ARE_TOKENS else pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None].to(tl.int64) * stride_a_row + offs_k[None, :] * stride_a_col
    b_ptrs = (
        b_ptr
        + expert * stride_b_expert
        + offs_k[:, None] * stride_b_k
        + offs_n[None, :].to(tl.int64) * stride_b_n
    )
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_dim, BLOCK_K):
        is_k = offs_k + k0 < k_dim
        a = tl.load(a_ptrs, mask=is_pair[:, None] & is_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=is_k[:, None] & (offs_n[None, :] < n_dim), other=0.0)
        if DOT_IN_FLOAT32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc += tl.dot(a, b, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_a_col
        b_ptrs += BLOCK_K * stride_b_k
    if MUL_ROUTED_WEIGHT:
        weight = tl.load(weights_ptr + pairs, mask=is_pair, other=0.0)
        acc = acc * weight[:, None]
    c_ptrs = c_ptr + pairs[:, None].to(tl.int64) * stride_c_row + offs_n[None, :] * stride_c_col
    tl.store(
        c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=is_pair[:, None] & (offs_n[None, :] < n_dim)
    )


def align_to_blocks(
    experts: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sorted pair ids padded so that each expert's rows fill whole blocks of `block_m`
    (padding: num_pairs), `[max_padded]` int64, and each block's expert (-1 past the used
    blocks), `[max_padded // block_m]` int64. Sized by the bound num_pairs + num_experts *
    (block_m - 1), so no count is read back to the host."""
    num_pairs = experts.numel()
    groups = group_by_expert(experts, num_experts)
    padded_counts = (groups.counts + block_m - 1) // block_m * block_m
    # where each expert's rows start, unpadded and padded
    starts = torch.cumsum(groups.counts, 0) - groups.counts
    padded_starts = torch.cumsum(padded_counts, 0) - padded_counts
    sorted_experts = experts.flatten()[groups.order]
    rank = torch.arange(num_pairs, device=experts.device) - starts[sorted_experts]
    max_padded = num_pairs + num_experts * (block_m - 1)
    max_padded = -(-max_padded // block_m) * block_m
    sorted_pairs = torch.full((max_padded,), num_pairs, dtype=torch.int64, device=experts.device)
    sorted_pairs[padded_starts[sorted_experts] + rank] = groups.order
    block_experts = torch.full(
        (max_padded // block_m,), -1, dtype=torch.int64, device=experts.device
    )
    blocks = torch.repeat_interleave(
        torch.arange(num_experts, device=experts.device),
        padded_counts // block_m,
        output_size=None,
    )
    block_experts[: blocks.numel()] = blocks
    return sorted_pairs, block_experts


def _expert_gemm(
    a: torch.Tensor,  # [rows, k]: tokens (A_ROWS_ARE_TOKENS) or pairs
    b: torch.Tensor,  # [num_experts, k, n]
    out: torch.Tensor,  # [num_pairs, n]
    weights: torch.Tensor | None,  # [num_pairs] float32: scale each row by it
    sorted_pairs: torch.Tensor,
    block_experts: torch.Tensor,
    top_k: int,
    a_rows_are_tokens: bool,
) -> None:
    grid = (block_experts.numel(), triton.cdiv(b.shape[2], BLOCK_N))
    _expert_gemm_kernel[grid](
        a,
        b,
        out,
        out if weights is None else weights,  # unread without MUL_ROUTED_WEIGHT
        sorted_pairs,
        block_experts,
        out.shape[0],
        b.shape[2],
        b.shape[1],
        *a.stride(),
        *b.stride(),
        *out.stride(),
        TOP_K=top_k,
        A_ROWS_ARE_TOKENS=a_rows_are_tokens,
        MUL_ROUTED_WEIGHT=weights is not None,
        DOT_PRECISION=dot_precision(a.dtype),
        # The interpreter's bfloat16 dot returns garbage; widened, its products are exact.
        DOT_IN_FLOAT32=IS_INTERPRETED and a.dtype == torch.bfloat16,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        num_warps=4,
    )


def expert_mlp(
    x: torch.Tensor,
    gate_up_t: torch.Tensor,
    down_t: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    clamp: ClampedSwiGLU | None = None,
) -> torch.Tensor:
    """Two launches of the grouped GEMM; the biases, the activation and the top-k sum in
    torch (the down bias added already weighted, as the kernel weighs its rows)."""
    check_expert_mlp(x, gate_up_t, down_t, experts, weights, gate_up_bias, down_bias)
    checks.check_triton_device(x.device, IS_INTERPRETED)
    num_tokens, top_k = experts.shape
    num_experts, hidden, two_inter = gate_up_t.shape
    if num_tokens == 0:
        return torch.zeros_like(x)
    sorted_pairs, block_experts = align_to_blocks(experts, num_experts, BLOCK_M)
    num_pairs = num_tokens * top_k
    gate_up = torch.empty(num_pairs, two_inter, dtype=x.dtype, device=x.device)
    _expert_gemm(x, gate_up_t, gate_up, None, sorted_pairs, block_experts, top_k, True)
    pair_experts = experts.flatten()  # row p is pair p
    if gate_up_bias is not None:
        gate_up += gate_up_bias[pair_experts]
    activated = activate(gate_up, clamp)  # [num_pairs, intermediate]
    out = torch.empty(num_pairs, hidden, dtype=torch.float32, device=x.device)
    _expert_gemm(
        activated, down_t, out, weights.flatten(), sorted_pairs, block_experts, top_k, False
    )
    if down_bias is not None:
        out += weights.flatten().unsqueeze(1) * down_bias[pair_experts].float()
    return out.view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)
