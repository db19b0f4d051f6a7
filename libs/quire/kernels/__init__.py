"""Paged-attention and KV-cache kernels: Triton for CUDA, C++ for CPU, plain torch as oracle.

Each public function picks its backend per call: Triton when the tensors are on CUDA; on the
CPU the C++ kernels (cpp_attention.py) for attention and cache writes when they are built
(`make kernels-cpu`), else the torch reference (reference.py), which also does block copies.
QUIRE_KERNEL_BACKEND=auto|cpp|torch|triton overrides the choice; cpp needs the built library
(and raises if it is missing), triton on CPU tensors needs TRITON_INTERPRET=1 set before the
kernels are imported. Triton and the C++ library are loaded on first use only, so importing
this package is cheap; when "auto" cannot load the C++ library it logs why, once. The fused
RMSNorm and rotary ops of a decoder layer (fused.py) follow the same choice on the CPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from quire.kernels import cpp_attention, reference

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
_BACKENDS = ("auto", "cpp", "torch", "triton")


def kernel_backend(device: torch.device) -> str:
    """The backend, "cpp", "torch" or "triton", that a call on tensors of this device uses.

    "cpp" runs the attention kernels, the cache write and the fused norm/rotary ops in C++;
    block copies stay in torch.
    """
    requested = os.environ.get(BACKEND_ENV_VAR, "auto").strip().lower() or "auto"
    if requested not in _BACKENDS:
        raise ValueError(f"{BACKEND_ENV_VAR} must be one of {_BACKENDS}, got {requested!r}")
    if requested == "auto":
        if device.type == "cuda":
            return "triton"
        return "cpp" if device.type == "cpu" and cpp_attention.is_available() else "torch"
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
    backend = kernel_backend(key.device)
    if backend == "triton":
        from quire.kernels import triton_cache

        triton_cache.write_kv_cache(key, value, key_cache, value_cache, slot_mapping)
    elif backend == "cpp":
        cpp_attention.write_kv_cache(key, value, key_cache, value_cache, slot_mapping)
    else:
        reference.write_kv_cache(key, value, key_cache, value_cache, slot_mapping)


def plan_decode(
    block_tables: torch.Tensor, context_lens: torch.Tensor, key_cache: torch.Tensor
) -> reference.DecodePlan | None:
    """The index work of a decode batch that every layer shares, done once (None when the
    backend needs none: the Triton and C++ kernels read block tables directly)."""
    if kernel_backend(key_cache.device) in ("triton", "cpp"):
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

    `plan` comes from `plan_decode` for the same block tables and lengths, or is None; only
    the torch reference uses it.
    """
    # query: [num_seqs, num_heads, head_dim] -> out: [num_seqs, num_heads, head_dim]
    # key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    # block_tables: [num_seqs, max_blocks_per_seq] int32
    # context_lens: [num_seqs] int32, including the current token
    backend = kernel_backend(query.device)
    if backend == "triton":
        from quire.kernels import triton_attention

        return triton_attention.paged_decode_attention(
            query, key_cache, value_cache, block_tables, context_lens, scale
        )
    if backend == "cpp":
        return cpp_attention.paged_decode_attention(
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
    backend = kernel_backend(query.device)
    if backend == "triton":
        from quire.kernels import triton_attention

        return triton_attention.paged_prefill_attention(
            query, key_cache, value_cache, block_tables, cu_query_lens, context_lens, scale
        )
    if backend == "cpp":
        return cpp_attention.paged_prefill_attention(
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
