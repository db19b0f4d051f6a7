"""Paged-attention and KV-cache kernels: Triton for CUDA, plain torch for CPU and as oracle.

Each public function picks its backend per call: Triton when the tensors are on CUDA, the
torch reference (reference.py) otherwise. QUIRE_KERNEL_BACKEND=auto|torch|triton overrides the
choice; triton on CPU tensors needs TRITON_INTERPRET=1 set before the kernels are imported.
Triton is imported on first use only, so importing this package on a CPU machine is cheap.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from quire.kernels import reference

__all__ = [
    "BACKEND_ENV_VAR",
    "copy_blocks",
    "kernel_backend",
    "paged_decode_attention",
    "paged_prefill_attention",
    "plan_decode",
    "write_kv_cache",
]

BACKEND_ENV_VAR = "QUIRE_KERNEL_BACKEND"
_BACKENDS = ("auto", "torch", "triton")


def kernel_backend(device: torch.device) -> str:
    """The backend, "torch" or "triton", that a call on tensors of this device uses."""
    requested = os.environ.get(BACKEND_ENV_VAR, "auto").strip().lower() or "auto"
    if requested not in _BACKENDS:
        raise ValueError(f"{BACKEND_ENV_VAR} must be one of {_BACKENDS}, got {requested!r}")
    if requested == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return requested


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter this step's keys and values into the paged cache at slot_mapping, in place."""
    # key, value: [num_tokens, num_kv_heads, head_dim]
    # key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    # slot_mapping: [num_tokens] int64, slot = block_id * block_size + offset, distinct
    if kernel_backend(key.device) == "triton":
        from quire.kernels import triton_cache

        triton_cache.write_kv_cache(key, value, key_cache, value_cache, slot_mapping)
    else:
        reference.write_kv_cache(key, value, key_cache, value_cache, slot_mapping)


def plan_decode(
    block_tables: torch.Tensor, context_lens: torch.Tensor, key_cache: torch.Tensor
) -> reference.DecodePlan | None:
    """The index work of a decode batch that every layer shares, done once (None when the
    backend needs none: the Triton kernel reads block tables directly)."""
    if kernel_backend(key_cache.device) == "triton":
        return None
    return reference.plan_decode(block_tables, context_lens, key_cache.shape[0], key_cache.shape[1])


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    plan: reference.DecodePlan | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its paged cache (see reference.py).

    `plan` comes from `plan_decode` for the same block tables and lengths, or is None.
    """
    # query: [num_seqs, num_heads, head_dim] -> out: [num_seqs, num_heads, head_dim]
    # key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    # block_tables: [num_seqs, max_blocks_per_seq] int32
    # context_lens: [num_seqs] int32, including the current token
    if kernel_backend(query.device) == "triton":
        from quire.kernels import triton_attention

        return triton_attention.paged_decode_attention(
            query, key_cache, value_cache, block_tables, context_lens, scale
        )
    return reference.paged_decode_attention(
        query, key_cache, value_cache, block_tables, context_lens, scale, plan
    )


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_query_lens: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of each sequence's chunk over its paged cache (see reference.py)."""
    # query: [num_tokens, num_heads, head_dim] -> out: [num_tokens, num_heads, head_dim]
    # key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    # block_tables: [num_seqs, max_blocks_per_seq] int32
    # cu_query_lens: [num_seqs + 1] int32; context_lens: [num_seqs] int32, prefix + chunk
    if kernel_backend(query.device) == "triton":
        from quire.kernels import triton_attention

        return triton_attention.paged_prefill_attention(
            query, key_cache, value_cache, block_tables, cu_query_lens, context_lens, scale
        )
    return reference.paged_prefill_attention(
        query, key_cache, value_cache, block_tables, cu_query_lens, context_lens, scale
    )


def copy_blocks(
    key_caches: Sequence[torch.Tensor],
    value_caches: Sequence[torch.Tensor],
    block_mapping: torch.Tensor,
) -> None:
    """Copy whole blocks src -> dst in every layer's caches, in place (see reference.py)."""
    # key_caches, value_caches: num_layers x [num_blocks, block_size, num_kv_heads, head_dim]
    # block_mapping: [num_pairs, 2] int64, rows of (src, dst)
    if kernel_backend(block_mapping.device) == "triton":
        from quire.kernels import triton_cache

        triton_cache.copy_blocks(key_caches, value_caches, block_mapping)
    else:
        reference.copy_blocks(key_caches, value_caches, block_mapping)
