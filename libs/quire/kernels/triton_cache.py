"""Paged KV cache writes and block copies in Triton.

The host wrappers implement signatures.KVCacheWrite and BlockCopy and check metadata only;
slot and block id values are trusted, so launching never syncs with the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from quire.kernels import checks

# Decided once, when the kernels are decorated: TRITON_INTERPRET=1 runs them on CPU tensors.
IS_INTERPRETED = bool(triton.knobs.runtime.interpret)

# Elements one copy program moves.
COPY_TILE = 4096


@triton.jit
def _write_kv_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    stride_k_token,
    stride_k_head,
    stride_k_dim,
    stride_v_token,
    stride_v_head,
    stride_v_dim,
    stride_kc_block,
    stride_kc_offset,
    stride_kc_head,
    stride_kc_dim,
    stride_vc_block,
    stride_vc_offset,
    stride_vc_head,
    stride_vc_dim,
    NUM_KV_HEADS: tl.constexpr,
    NUM_KV_HEADS_PADDED: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # One program per token: all its kv heads at once, as a [heads, head_dim] tile.
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    block_id = slot // BLOCK_SIZE
    block_offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, NUM_KV_HEADS_PADDED)
    offs_d = tl.arange(0, HEAD_DIM)
    is_head = offs_h[:, None] < NUM_KV_HEADS

    k = tl.load(
        key_ptr
        + token * stride_k_token
        + offs_h[:, None] * stride_k_head
        + offs_d[None, :] * stride_k_dim,
        mask=is_head,
    )
    tl.store(
        key_cache_ptr
        + block_id * stride_kc_block
        + block_offset * stride_kc_offset
        + offs_h[:, None] * stride_kc_head
        + offs_d[None, :] * stride_kc_dim,
        k,
        mask=is_head,
    )
    v = tl.load(
        value_ptr
        + token * stride_v_token
        + offs_h[:, None] * stride_v_head
        + offs_d[None, :] * stride_v_dim,
        mask=is_head,
    )
    tl.store(
        value_cache_ptr
        + block_id * stride_vc_block
        + block_offset * stride_vc_offset
        + offs_h[:, None] * stride_vc_head
        + offs_d[None, :] * stride_vc_dim,
        v,
        mask=is_head,
    )


@triton.jit
def _copy_blocks_kernel(
    cache_ptrs_ptr,
    first_cache_ptr,
    block_mapping_ptr,
    stride_cache_block,
    stride_mapping_pair,
    stride_mapping_side,
    BLOCK_NUMEL: tl.constexpr,
    COPY_TILE: tl.constexpr,
):
    # One program per (pair, cache, tile of a block). Every layer's cache is a separate
    # tensor, so the caches come as a table of raw addresses (as in Triton's grouped-GEMM
    # tutorial), cast back to first_cache_ptr's pointer type; a block is BLOCK_NUMEL
    # contiguous elements.
    pair = tl.program_id(0).to(tl.int64)
    cache = tl.program_id(1)
    tile = tl.program_id(2)
    src = tl.load(block_mapping_ptr + pair * stride_mapping_pair)
    dst = tl.load(block_mapping_ptr + pair * stride_mapping_pair + stride_mapping_side)
    cache_ptr = tl.load(cache_ptrs_ptr + cache).to(first_cache_ptr.dtype)
    offs = tile * COPY_TILE + tl.arange(0, COPY_TILE)
    is_inside = offs < BLOCK_NUMEL
    x = tl.load(cache_ptr + src * stride_cache_block + offs, mask=is_inside)
    tl.store(cache_ptr + dst * stride_cache_block + offs, x, mask=is_inside)


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """One program per token. Needs head_dim a power of two in [16, 256] and a contiguous
    slot_mapping."""
    cache = checks.check_write_kv_cache(key, value, key_cache, value_cache, slot_mapping)
    checks.check_triton_head_dim(cache.head_dim)
    checks.check_triton_device(key.device, IS_INTERPRETED)
    checks.check_contiguous(slot_mapping=slot_mapping)
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    _write_kv_cache_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        *key.stride(),
        *value.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        NUM_KV_HEADS=cache.num_kv_heads,
        NUM_KV_HEADS_PADDED=triton.next_power_of_2(cache.num_kv_heads),
        HEAD_DIM=cache.head_dim,
        BLOCK_SIZE=cache.block_size,
        num_warps=4,
    )


def copy_blocks(
    key_caches: Sequence[torch.Tensor],
    value_caches: Sequence[torch.Tensor],
    block_mapping: torch.Tensor,
) -> None:
    """One launch for all layers; every cache must be contiguous."""
    cache = checks.check_copy_blocks(key_caches, value_caches, block_mapping)
    if cache is None or block_mapping.shape[0] == 0:
        return
    caches = [*key_caches, *value_caches]
    checks.check_triton_device(block_mapping.device, IS_INTERPRETED)
    checks.check_contiguous(**{f"cache {i}": layer_cache for i, layer_cache in enumerate(caches)})
    # cache_ptrs: [2 * num_layers] int64, keys then values
    cache_ptrs = torch.tensor(
        [layer_cache.data_ptr() for layer_cache in caches],
        dtype=torch.int64,
        device=block_mapping.device,
    )
    block_numel = cache.block_size * cache.num_kv_heads * cache.head_dim
    copy_tile = min(COPY_TILE, triton.next_power_of_2(block_numel))
    grid = (block_mapping.shape[0], len(caches), triton.cdiv(block_numel, copy_tile))
    _copy_blocks_kernel[grid](
        cache_ptrs,
        caches[0],
        block_mapping,
        caches[0].stride(0),
        *block_mapping.stride(),
        BLOCK_NUMEL=block_numel,
        COPY_TILE=copy_tile,
        num_warps=4,
    )
