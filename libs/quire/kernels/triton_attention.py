"""Paged attention in Triton: decode (one token per sequence) and varlen causal prefill.

Both kernels are flash-attention style: stream the sequence's keys and values in tiles of
token positions, looking each position's block up in the block table, and keep an online
softmax (running max m_i, running sum l_i) in float32. A tile of positions may straddle
cache blocks, so the tile size does not depend on block_size. GQA: query head h reads kv
head h // (num_heads // num_kv_heads).

A sliding window W starts a program's loop at the first key its earliest row sees and masks
each row's keys before its own window; the blocks before are never read. A soft cap c turns each
scaled score s into c * tanh(s / c) before the softmax (WINDOW and SOFT_CAP are runtime values;
HAS_WINDOW and HAS_SOFT_CAP compile them in only where used). Sinks (HAS_SINKS) start a head's
online softmax from its sink logit (m_i = sink, l_i = 1) instead of from nothing, so the sink
sits in every row's denominator with no value.

The host wrappers implement signatures.PagedAttention and check metadata only; index values
(slots, block ids, lengths) are trusted, so that launching never syncs with the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quire.kernels import checks

# Decided once, when the kernels are decorated: TRITON_INTERPRET=1 runs them on CPU tensors.
IS_INTERPRETED = bool(triton.knobs.runtime.interpret)


@triton.jit
def _soft_cap_log2(scores, scale, soft_cap, HAS_SOFT_CAP: tl.constexpr):
    # q . k -> the base-2 logits the softmax takes: scale, soft-cap c * tanh(s / c), * log2(e).
    # tanh(x) = 1 - 2 / (exp(2x) + 1): exact at both ends (exp overflows to inf, or is 0).
    scores = scores * scale
    if HAS_SOFT_CAP:
        scores = soft_cap * (1.0 - 2.0 / (tl.exp(2.0 * scores / soft_cap) + 1.0))
    return scores * 1.4426950408889634


@triton.jit
def _paged_decode_attention_kernel(
    out_ptr,
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    sinks_ptr,
    scale,
    window,
    soft_cap,
    stride_out_seq,
    stride_out_head,
    stride_out_dim,
    stride_q_seq,
    stride_q_head,
    stride_q_dim,
    stride_kc_block,
    stride_kc_offset,
    stride_kc_head,
    stride_kc_dim,
    stride_vc_block,
    stride_vc_offset,
    stride_vc_head,
    stride_vc_dim,
    stride_bt_seq,
    stride_bt_block,
    QUERY_GROUP_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    TILE_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFT_CAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    # One program per (sequence, query head); the query is a single row, so scores are a
    # broadcast multiply + row sum rather than a tl.dot (which needs >= 16 rows).
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    kv_head = head // QUERY_GROUP_SIZE
    context_len = tl.load(context_lens_ptr + seq)

    offs_d = tl.arange(0, HEAD_DIM)
    # q: [HEAD_DIM]
    q = tl.load(query_ptr + seq * stride_q_seq + head * stride_q_head + offs_d * stride_q_dim)
    q = q.to(tl.float32)

    m_i = -float("inf")
    l_i = 0.0
    if HAS_SINKS:  # the head's sink, a base-2 logit already seen with weight 1
        m_i = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        l_i = 1.0
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    first_key = 0
    if HAS_WINDOW:
        first_key = tl.maximum(context_len - window, 0)
    for start_n in range(first_key, context_len, TILE_N):
        offs_n = start_n + tl.arange(0, TILE_N)
        is_valid = offs_n < context_len
        # block_ids: [TILE_N], the physical block of each position in the tile.
        block_ids = tl.load(
            block_tables_ptr + seq * stride_bt_seq + (offs_n // BLOCK_SIZE) * stride_bt_block,
            mask=is_valid,
            other=0,
        ).to(tl.int64)
        slot_offsets = offs_n % BLOCK_SIZE
        # k, v: [TILE_N, HEAD_DIM]
        k = tl.load(
            key_cache_ptr
            + block_ids[:, None] * stride_kc_block
            + slot_offsets[:, None] * stride_kc_offset
            + kv_head * stride_kc_head
            + offs_d[None, :] * stride_kc_dim,
            mask=is_valid[:, None],
            other=0.0,
        ).to(tl.float32)
        scores = _soft_cap_log2(tl.sum(k * q[None, :], axis=1), scale, soft_cap, HAS_SOFT_CAP)
        scores = tl.where(is_valid, scores, -float("inf"))
        # Every tile holds at least one valid position, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new)
        v = tl.load(
            value_cache_ptr
            + block_ids[:, None] * stride_vc_block
            + slot_offsets[:, None] * stride_vc_offset
            + kv_head * stride_vc_head
            + offs_d[None, :] * stride_vc_dim,
            mask=is_valid[:, None],
            other=0.0,
        ).to(tl.float32)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new

    out = acc / l_i
    tl.store(
        out_ptr + seq * stride_out_seq + head * stride_out_head + offs_d * stride_out_dim,
        out.to(out_ptr.dtype.element_ty),
    )


@triton.jit
def _find_seq(cu_query_lens_ptr, tile, num_seqs, BLOCK_M: tl.constexpr):
    # Sequence s owns query tiles [cu[s] // BLOCK_M + s, cu[s+1] // BLOCK_M + s + 1): at least
    # cdiv(q_s, BLOCK_M) of them, found without a host sync. Binary search for the last
    # sequence whose first tile is <= tile.
    left: tl.int32 = 0
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        first_tile = tl.load(cu_query_lens_ptr + mid) // BLOCK_M + mid
        if first_tile <= tile:
            left = mid + 1
        else:
            right = mid
    return left - 1


# num_seqs stays a runtime int32 even when it is 1 (Triton would make that a constexpr), so
# the binary search in _find_seq always sees the same types.
@triton.jit(do_not_specialize=["num_seqs"])
def _paged_prefill_attention_kernel(
    out_ptr,
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    cu_query_lens_ptr,
    context_lens_ptr,
    sinks_ptr,
    scale,
    window,
    soft_cap,
    num_seqs,
    stride_out_token,
    stride_out_head,
    stride_out_dim,
    stride_q_token,
    stride_q_head,
    stride_q_dim,
    stride_kc_block,
    stride_kc_offset,
    stride_kc_head,
    stride_kc_dim,
    stride_vc_block,
    stride_vc_offset,
    stride_vc_head,
    stride_vc_dim,
    stride_bt_seq,
    stride_bt_block,
    QUERY_GROUP_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFT_CAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    # One program per (query tile of BLOCK_M chunk tokens of one sequence, query head).
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // QUERY_GROUP_SIZE
    seq = _find_seq(cu_query_lens_ptr, tile, num_seqs, BLOCK_M)
    query_start = tl.load(cu_query_lens_ptr + seq)
    query_len = tl.load(cu_query_lens_ptr + seq + 1) - query_start
    tile_start = (tile - (query_start // BLOCK_M + seq)) * BLOCK_M
    if tile_start >= query_len:
        return
    context_len = tl.load(context_lens_ptr + seq)
    prefix_len = context_len - query_len

    # offs_m: [BLOCK_M] rows of the chunk; their absolute positions are prefix_len + offs_m.
    offs_m = tile_start + tl.arange(0, BLOCK_M)
    is_row = offs_m < query_len
    query_positions = prefix_len + offs_m
    offs_d = tl.arange(0, HEAD_DIM)
    tokens = (query_start + offs_m).to(tl.int64)
    # q: [BLOCK_M, HEAD_DIM]
    q = tl.load(
        query_ptr
        + tokens[:, None] * stride_q_token
        + head * stride_q_head
        + offs_d[None, :] * stride_q_dim,
        mask=is_row[:, None],
        other=0.0,
    )

    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_SINKS:  # every row starts from the head's sink, a base-2 logit of weight 1
        m_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32) * (
            tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        )
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # Keys past the tile's last row are in every row's future; stop there.
    kv_end = tl.minimum(context_len, prefix_len + tile_start + BLOCK_M)
    # Keys before the first row's window are in no row's window; start there.
    kv_start = 0
    if HAS_WINDOW:
        kv_start = tl.maximum(prefix_len + tile_start - window + 1, 0)
    bt_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    for start_n in range(kv_start, kv_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        is_key = offs_n < kv_end
        block_ids = tl.load(
            bt_row_ptr + (offs_n // BLOCK_SIZE) * stride_bt_block, mask=is_key, other=0
        ).to(tl.int64)
        slot_offsets = offs_n % BLOCK_SIZE
        # k, v: [BLOCK_N, HEAD_DIM]
        k = tl.load(
            key_cache_ptr
            + block_ids[:, None] * stride_kc_block
            + slot_offsets[:, None] * stride_kc_offset
            + kv_head * stride_kc_head
            + offs_d[None, :] * stride_kc_dim,
            mask=is_key[:, None],
            other=0.0,
        )
        # scores: [BLOCK_M, BLOCK_N]
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        scores = _soft_cap_log2(scores, scale, soft_cap, HAS_SOFT_CAP)
        is_visible = is_key[None, :] & (offs_n[None, :] <= query_positions[:, None])
        if HAS_WINDOW:
            is_visible = is_visible & (offs_n[None, :] > query_positions[:, None] - window)
        scores = tl.where(is_visible, scores, -float("inf"))
        # A row may see nothing yet (a window starting in a later tile, a padding row): its
        # max stays -inf, so subtract 0 instead and let exp2(-inf) be 0 (never -inf - -inf).
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(scores - m_safe[:, None])
        v = tl.load(
            value_cache_ptr
            + block_ids[:, None] * stride_vc_block
            + slot_offsets[:, None] * stride_vc_offset
            + kv_head * stride_vc_head
            + offs_d[None, :] * stride_vc_dim,
            mask=is_key[:, None],
            other=0.0,
        )
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    # Padding rows may have seen nothing (l_i = 0); their stores are masked.
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        out_ptr
        + tokens[:, None] * stride_out_token
        + head * stride_out_head
        + offs_d[None, :] * stride_out_dim,
        out.to(out_ptr.dtype.element_ty),
        mask=is_row[:, None],
    )


def _check_triton(shape: checks.AttentionShape, query: torch.Tensor) -> None:
    checks.check_triton_head_dim(shape.cache.head_dim)
    checks.check_triton_device(query.device, IS_INTERPRETED)


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs would default to TF32 tensor cores (~1e-3 error); keep them exact. The
    # setting has no effect on 16-bit inputs.
    return "ieee" if dtype == torch.float32 else "tf32"


def _decode_tile(head_dim: int) -> int:
    # TILE_N: 4096-element K/V tiles over 8 warps, 16 elements a thread; no register spills
    # on sm_90 for head_dim 32..256.
    return max(16, 4096 // head_dim)


def _prefill_tiles(head_dim: int, dtype: torch.dtype) -> tuple[int, int, int]:
    # (BLOCK_M, BLOCK_N, num_warps). Picked by compiling for sm_90 and keeping the largest
    # tiles that do not spill registers; not yet tuned by timing on a GPU. fp32 runs the
    # dots on CUDA cores (ieee), which needs far more registers than 16-bit tensor cores.
    if dtype == torch.float32:
        return 16, 16, 4 if head_dim <= 128 else 8
    if head_dim <= 64:
        return 64, 64, 8
    if head_dim <= 128:
        return 64, 32, 8
    return 32, 32, 8


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One program per (sequence, query head). Needs head_dim a power of two in [16, 256] and
    a contiguous context_lens."""
    shape = checks.check_decode(query, key_cache, value_cache, block_tables, context_lens)
    checks.check_window_and_cap(sliding_window, logits_soft_cap)
    checks.check_sinks(sinks, query)
    _check_triton(shape, query)
    checks.check_contiguous(context_lens=context_lens)
    # out: [num_seqs, num_heads, head_dim]
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if shape.num_seqs == 0:
        return out
    grid = (shape.num_seqs, shape.num_heads)
    _paged_decode_attention_kernel[grid](
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        query if sinks is None else sinks.contiguous(),  # any pointer where there are none
        float(scale),
        sliding_window or 0,
        float(logits_soft_cap or 0.0),
        *out.stride(),
        *query.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        *block_tables.stride(),
        QUERY_GROUP_SIZE=shape.query_group_size,
        BLOCK_SIZE=shape.cache.block_size,
        HEAD_DIM=shape.cache.head_dim,
        TILE_N=_decode_tile(shape.cache.head_dim),
        HAS_WINDOW=sliding_window is not None,
        HAS_SOFT_CAP=logits_soft_cap is not None,
        HAS_SINKS=sinks is not None,
        num_warps=8,
    )
    return out


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_query_lens: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One program per (query tile, query head), each finding its sequence on the device.
    Needs head_dim a power of two in [16, 256], contiguous cu_query_lens and context_lens."""
    shape = checks.check_prefill(
        query, key_cache, value_cache, block_tables, cu_query_lens, context_lens
    )
    checks.check_window_and_cap(sliding_window, logits_soft_cap)
    checks.check_sinks(sinks, query)
    _check_triton(shape, query)
    checks.check_contiguous(cu_query_lens=cu_query_lens, context_lens=context_lens)
    # out: [num_tokens, num_heads, head_dim]
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    num_tokens = query.shape[0]
    if num_tokens == 0:
        return out
    head_dim = shape.cache.head_dim
    block_m, block_n, num_warps = _prefill_tiles(head_dim, query.dtype)
    # Each sequence gets cdiv(q_s, BLOCK_M) tiles, plus at most one that exits at once.
    grid = (num_tokens // block_m + shape.num_seqs, shape.num_heads)
    _paged_prefill_attention_kernel[grid](
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
        cu_query_lens,
        context_lens,
        query if sinks is None else sinks.contiguous(),  # any pointer where there are none
        float(scale),
        sliding_window or 0,
        float(logits_soft_cap or 0.0),
        shape.num_seqs,
        *out.stride(),
        *query.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        *block_tables.stride(),
        QUERY_GROUP_SIZE=shape.query_group_size,
        BLOCK_SIZE=shape.cache.block_size,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        DOT_PRECISION=_dot_precision(query.dtype),
        HAS_WINDOW=sliding_window is not None,
        HAS_SOFT_CAP=logits_soft_cap is not None,
        HAS_SINKS=sinks is not None,
        num_warps=num_warps,
        num_stages=2,
    )
    return out
