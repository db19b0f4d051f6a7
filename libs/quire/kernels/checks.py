"""Argument checks shared by the torch reference and the C++ and Triton host wrappers.

Only metadata is checked here (shapes, dtypes, devices, strides): reading tensor values would
force a device sync on CUDA. The torch reference checks values as well (see reference.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class CacheShape:
    """Dimensions of one layer's paged KV cache."""

    num_blocks: int  # physical blocks in the cache
    block_size: int  # token slots per block
    num_kv_heads: int  # key/value heads per slot
    head_dim: int  # channels per head


@dataclass(frozen=True)
class AttentionShape:
    """Dimensions of one paged-attention call."""

    cache: CacheShape  # the cache being read
    num_seqs: int  # sequences in the batch
    num_heads: int  # query heads
    max_blocks_per_seq: int  # columns of the block table

    @property
    def query_group_size(self) -> int:
        # Query heads sharing one kv head: 1 for MHA, num_heads for MQA.
        return self.num_heads // self.cache.num_kv_heads


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


def check_index(name: str, tensor: torch.Tensor, ndim: int, dtype: torch.dtype) -> None:
    """Raise ValueError unless tensor is an ndim-dimensional index tensor of dtype."""
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {_shape(tensor)}")
    if tensor.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {tensor.dtype}")


def check_same_device(**tensors: torch.Tensor) -> None:
    """Raise ValueError unless every tensor lives on one device."""
    devices = {name: tensor.device for name, tensor in tensors.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise ValueError(f"tensors must be on one device, got {listing}")


def check_kv_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> CacheShape:
    """Check one layer's key and value caches and return their dimensions."""
    # key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    if key_cache.dim() != 4:
        raise ValueError(
            "key_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got shape {_shape(key_cache)}"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(
            f"value_cache shape {_shape(value_cache)} != key_cache shape {_shape(key_cache)}"
        )
    if key_cache.dtype not in FLOAT_DTYPES:
        raise ValueError(f"key_cache dtype must be one of {FLOAT_DTYPES}, got {key_cache.dtype}")
    if value_cache.dtype != key_cache.dtype:
        raise ValueError(f"value_cache dtype {value_cache.dtype} != key_cache {key_cache.dtype}")
    check_same_device(key_cache=key_cache, value_cache=value_cache)
    if min(key_cache.shape) == 0:
        raise ValueError(f"key_cache has an empty dimension: shape {_shape(key_cache)}")
    return CacheShape(*key_cache.shape)


def check_write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> CacheShape:
    """Check write_kv_cache arguments and return the cache dimensions."""
    cache = check_kv_cache(key_cache, value_cache)
    expected = ("num_tokens", cache.num_kv_heads, cache.head_dim)
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dim() != 3 or tuple(tensor.shape[1:]) != expected[1:]:
            raise ValueError(f"{name} must be {list(expected)}, got shape {_shape(tensor)}")
        if tensor.dtype != key_cache.dtype:
            raise ValueError(f"{name} dtype {tensor.dtype} != cache dtype {key_cache.dtype}")
    if value.shape != key.shape:
        raise ValueError(f"value shape {_shape(value)} != key shape {_shape(key)}")
    check_index("slot_mapping", slot_mapping, 1, torch.int64)
    if slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(
            f"slot_mapping has {slot_mapping.shape[0]} entries for {key.shape[0]} tokens"
        )
    check_same_device(key=key, value=value, key_cache=key_cache, slot_mapping=slot_mapping)
    return cache


def _check_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> AttentionShape:
    cache = check_kv_cache(key_cache, value_cache)
    if query.dim() != 3 or query.shape[2] != cache.head_dim:
        raise ValueError(
            f"query must be [num_tokens, num_heads, {cache.head_dim}], got shape {_shape(query)}"
        )
    if query.dtype != key_cache.dtype:
        raise ValueError(f"query dtype {query.dtype} != cache dtype {key_cache.dtype}")
    num_heads = query.shape[1]
    if num_heads == 0 or num_heads % cache.num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({num_heads}) must be a positive multiple of "
            f"num_kv_heads ({cache.num_kv_heads})"
        )
    check_index("block_tables", block_tables, 2, torch.int32)
    check_index("context_lens", context_lens, 1, torch.int32)
    num_seqs = context_lens.shape[0]
    if block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows for {num_seqs} sequences")
    if block_tables.shape[1] == 0:
        raise ValueError("block_tables must have at least one column")
    check_same_device(
        query=query, key_cache=key_cache, block_tables=block_tables, context_lens=context_lens
    )
    return AttentionShape(
        cache=cache,
        num_seqs=num_seqs,
        num_heads=num_heads,
        max_blocks_per_seq=block_tables.shape[1],
    )


def check_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> AttentionShape:
    """Check paged_decode_attention arguments and return the call's dimensions."""
    shape = _check_attention(query, key_cache, value_cache, block_tables, context_lens)
    if query.shape[0] != shape.num_seqs:
        raise ValueError(
            f"decode takes one query token per sequence: query has {query.shape[0]} tokens "
            f"for {shape.num_seqs} sequences"
        )
    return shape


def check_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_query_lens: torch.Tensor,
    context_lens: torch.Tensor,
) -> AttentionShape:
    """Check paged_prefill_attention arguments and return the call's dimensions."""
    shape = _check_attention(query, key_cache, value_cache, block_tables, context_lens)
    check_index("cu_query_lens", cu_query_lens, 1, torch.int32)
    if cu_query_lens.shape[0] != shape.num_seqs + 1:
        raise ValueError(
            f"cu_query_lens must have num_seqs + 1 = {shape.num_seqs + 1} entries, "
            f"got {cu_query_lens.shape[0]}"
        )
    check_same_device(query=query, cu_query_lens=cu_query_lens)
    return shape


def check_copy_blocks(
    key_caches: Sequence[torch.Tensor],
    value_caches: Sequence[torch.Tensor],
    block_mapping: torch.Tensor,
) -> CacheShape | None:
    """Check copy_blocks arguments; return the (shared) cache dimensions, None for no layers."""
    if len(key_caches) != len(value_caches):
        raise ValueError(f"{len(key_caches)} key caches but {len(value_caches)} value caches")
    check_index("block_mapping", block_mapping, 2, torch.int64)
    if block_mapping.shape[1] != 2:
        raise ValueError(
            f"block_mapping must be [num_pairs, 2] (src, dst), got shape {_shape(block_mapping)}"
        )
    if not key_caches:
        return None
    first = key_caches[0]
    cache = check_kv_cache(first, value_caches[0])
    for layer, (key_cache, value_cache) in enumerate(zip(key_caches, value_caches, strict=True)):
        check_kv_cache(key_cache, value_cache)
        if key_cache.shape != first.shape or key_cache.dtype != first.dtype:
            raise ValueError(
                f"layer {layer} cache is {_shape(key_cache)} {key_cache.dtype}, "
                f"layer 0 is {_shape(first)} {first.dtype}: all layers must match"
            )
    check_same_device(
        **{f"key_caches[{layer}]": key_cache for layer, key_cache in enumerate(key_caches)},
        block_mapping=block_mapping,
    )
    return cache


def check_window_and_cap(sliding_window: int | None, logits_soft_cap: float | None) -> None:
    """Raise ValueError unless the window is None or >= 1 and the soft cap None or > 0."""
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be None or >= 1, got {sliding_window}")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be None or > 0, got {logits_soft_cap}")


def check_sinks(sinks: torch.Tensor | None, query: torch.Tensor) -> None:
    """Raise ValueError unless `sinks` is None or one float32 logit per query head, on the
    query's device."""
    if sinks is None:
        return
    num_heads = query.shape[1]
    if sinks.dtype != torch.float32 or sinks.shape != (num_heads,):
        raise ValueError(
            f"sinks must be [{num_heads}] float32 (one per query head), got "
            f"{tuple(sinks.shape)} {sinks.dtype}"
        )
    if sinks.device != query.device:
        raise ValueError(f"sinks must be on the query's device {query.device}, got {sinks.device}")


def check_triton_head_dim(head_dim: int) -> None:
    """Raise ValueError unless the Triton kernels can tile head_dim (tl.arange needs 2**k)."""
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        raise ValueError(
            f"Triton kernels need head_dim to be a power of two in [16, 256], got {head_dim}"
        )


def check_triton_device(device: torch.device, is_interpreted: bool) -> None:
    """Raise ValueError unless Triton can run on tensors of this device."""
    if device.type != "cuda" and not is_interpreted:
        raise ValueError(
            f"Triton kernels need CUDA tensors, got {device}; on CPU set TRITON_INTERPRET=1 "
            "before triton is imported, or use the torch reference (QUIRE_KERNEL_BACKEND=torch)"
        )


def check_contiguous(**tensors: torch.Tensor) -> None:
    """Raise ValueError unless every tensor is contiguous."""
    for name, tensor in tensors.items():
        if not tensor.is_contiguous():
            raise ValueError(
                f"{name} must be contiguous, got shape {_shape(tensor)} strides {tensor.stride()}"
            )
