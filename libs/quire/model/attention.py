"""Paged attention layer and the per-step metadata that tells kernels where KV lives."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import quire.kernels as kernels

KVCache = tuple[torch.Tensor, torch.Tensor]  # key, value: [num_blocks, block_size, kv_heads, D]


@dataclass
class AttentionMetadata:
    """Tensors describing one flattened batch (no padding) for the paged kernels."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot each new token's KV goes to
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    context_lens: torch.Tensor  # [num_seqs] int32: tokens in cache after this step's write
    cu_query_lens: torch.Tensor  # [num_seqs + 1] int32: prefix sums of per-seq new tokens
    is_decode_only: bool  # every sequence runs exactly one token
    _decode_plan: kernels.reference.DecodePlan | None = field(default=None, repr=False)
    _planned: bool = field(default=False, repr=False)

    def decode_plan(self, key_cache: torch.Tensor) -> kernels.reference.DecodePlan | None:
        """The decode gathers every layer shares, planned on the first layer's call."""
        if not self._planned:
            self._decode_plan = kernels.plan_decode(self.block_tables, self.context_lens, key_cache)
            self._planned = True
        return self._decode_plan


class PagedAttention:
    """Writes this step's K/V through the slot mapping, then attends over the cache."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale

    def __call__(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        key_cache, value_cache = kv_cache
        # Write first: every query then reads its own chunk back from the cache, so a
        # cached prefix and the new chunk are one code path.
        kernels.write_kv_cache(k, v, key_cache, value_cache, meta.slot_mapping)
        if meta.is_decode_only:
            return kernels.paged_decode_attention(
                q,
                key_cache,
                value_cache,
                meta.block_tables,
                meta.context_lens,
                self.scale,
                meta.decode_plan(key_cache),
            )
        return kernels.paged_prefill_attention(
            q,
            key_cache,
            value_cache,
            meta.block_tables,
            meta.cu_query_lens,
            meta.context_lens,
            self.scale,
        )
