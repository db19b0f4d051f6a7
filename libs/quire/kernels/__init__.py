"""Quire's kernels: paged attention, the paged KV cache's writes and block copies, the fused
RMSNorm and rotary ops of a decoder layer, packed linears, and the experts of a
mixture-of-experts layer (reference_experts.py, grouped_experts.py, triton_experts.py).

signatures.py writes each kernel family's signature once, as a Protocol, and three backends
implement it: plain torch (reference.py, reference_fused.py), the oracle and the fallback; C++
for the CPU (cpp_attention.py, cpp_fused.py, packed_linear.py; sources in csrc/, compiled by
`make kernels-cpu`); Triton for CUDA (triton_attention.py, triton_cache.py). backends.py holds
the one rule that picks the backend for a call. The functions below are what the model calls:
each asks that rule for its tensors' device and runs the backend's kernel. Importing this
package does not import triton.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quire.kernels import backends, reference, signatures

__all__ = [
    "add_rms_norm_",
    "copy_blocks",
    "expert_mlp",
    "paged_decode_attention",
    "paged_prefill_attention",
    "plan_decode",
    "rms_norm",
    "rotary_embedding_",
    "write_kv_cache",
]


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """signatures.KVCacheWrite.write_kv_cache on the backend for key's device."""
    kernels = backends.kv_cache_write(key.device)
    kernels.write_kv_cache(key, value, key_cache, value_cache, slot_mapping)


def copy_blocks(
    key_caches: Sequence[torch.Tensor],
    value_caches: Sequence[torch.Tensor],
    block_mapping: torch.Tensor,
) -> None:
    """signatures.BlockCopy.copy_blocks on the backend for block_mapping's device."""
    backends.block_copy(block_mapping.device).copy_blocks(key_caches, value_caches, block_mapping)


def plan_decode(
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    key_cache: torch.Tensor,
    sliding_window: int | None = None,
) -> reference.DecodePlan | None:
    """The index work of a decode batch that every layer with this window shares, done once
    for the torch reference; None where the backend needs none (C++ and Triton read block
    tables directly)."""
    if backends.paged_attention(key_cache.device) is not reference:
        return None
    return reference.plan_decode(
        block_tables, context_lens, key_cache.shape[0], key_cache.shape[1], sliding_window
    )


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
    plan: reference.DecodePlan | None = None,
) -> torch.Tensor:
    """signatures.PagedAttention.paged_decode_attention on the backend for query's device.

    `plan` comes from `plan_decode` for the same block tables, lengths and window, or is None;
    only the torch reference uses it.
    """
    kernels = backends.paged_attention(query.device)
    args = (query, key_cache, value_cache, block_tables, context_lens, scale)
    if kernels is reference:
        return reference.paged_decode_attention(*args, sliding_window, logits_soft_cap, sinks, plan)
    return kernels.paged_decode_attention(*args, sliding_window, logits_soft_cap, sinks)


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
    """signatures.PagedAttention.paged_prefill_attention on the backend for query's device."""
    return backends.paged_attention(query.device).paged_prefill_attention(
        query,
        key_cache,
        value_cache,
        block_tables,
        cu_query_lens,
        context_lens,
        scale,
        sliding_window,
        logits_soft_cap,
        sinks,
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """signatures.FusedNormRotary.rms_norm on the backend for x's device."""
    return backends.fused_norm_rotary(x.device).rms_norm(x, weight, eps)


def add_rms_norm_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    """signatures.FusedNormRotary.add_rms_norm_ on the backend for x's device."""
    backends.fused_norm_rotary(x.device).add_rms_norm_(x, residual, weight, eps)


def rotary_embedding_(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> None:
    """signatures.FusedNormRotary.rotary_embedding_ on the backend for query's device."""
    backends.fused_norm_rotary(query.device).rotary_embedding_(positions, query, key, cos, sin)


def expert_mlp(
    x: torch.Tensor,
    gate_up_t: torch.Tensor,
    down_t: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    clamp: signatures.ClampedSwiGLU | None = None,
) -> torch.Tensor:
    """signatures.ExpertMlp.expert_mlp on the backend for x's device."""
    return backends.expert_mlp(x.device).expert_mlp(
        x, gate_up_t, down_t, experts, weights, gate_up_bias, down_bias, clamp
    )
