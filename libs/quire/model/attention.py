"""Paged attention layer and the per-step metadata that tells kernels where KV lives."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import quire.kernels as kernels

# One layer's cache planes, each [num_blocks, block_size, heads, D]: (key, value) with
# kv_heads, or an MLA layer's one latent (one head of kv_lora_rank + qk_rope_head_dim).
KVCache = tuple[torch.Tensor, ...]


@dataclass
class AttentionMetadata:
    """Tensors describing one flattened batch (no padding) for the paged kernels."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot each new token's KV goes to
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    context_lens: torch.Tensor  # [num_seqs] int32: tokens in cache after this step's write
    cu_query_lens: torch.Tensor  # [num_seqs + 1] int32: prefix sums of per-seq new tokens
    is_decode_only: bool  # every sequence runs exactly one token
    # Per layer, the metadata of its KV group (quire.model.attention_layout.KVGroups): its
    # own block tables and slot mapping. None: every layer reads through this one.
    layer_metas: list[AttentionMetadata] | None = field(default=None, repr=False)
    # sliding window (None: global) -> its layers' decode plan
    _decode_plans: dict[int | None, kernels.reference.DecodePlan | None] = field(
        default_factory=dict, repr=False
    )

    def for_layer(self, layer: int) -> AttentionMetadata:
        """What layer `layer` reads and writes through."""
        return self if self.layer_metas is None else self.layer_metas[layer]

    def decode_plan(
        self, key_cache: torch.Tensor, sliding_window: int | None = None
    ) -> kernels.reference.DecodePlan | None:
        """The decode gathers every layer with this window shares, planned on the first such
        layer's call."""
        if sliding_window not in self._decode_plans:
            self._decode_plans[sliding_window] = kernels.plan_decode(
                self.block_tables, self.context_lens, key_cache, sliding_window
            )
        return self._decode_plans[sliding_window]


class PagedAttention:
    """Writes this step's K/V through the slot mapping, then attends over the cache (one
    layer's: its window and soft cap are its own)."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        sliding_window: int | None = None,  # attend to the latest W positions; None: all
        logits_soft_cap: float | None = None,  # scores -> cap * tanh(score / cap); None: none
        sinks: torch.Tensor | None = None,  # [num_heads] float32, a value-less logit (gpt-oss)
    ) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.sinks = sinks

    def __call__(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        key_cache, value_cache = kv_cache
        # A cache narrower than the model (EngineConfig.kv_cache_dtype): the new keys and
        # values are stored rounded to it, and the kernels read the queries in it too.
        out_dtype = q.dtype
        narrow = key_cache.dtype != out_dtype
        if narrow:
            q, k, v = q.to(key_cache.dtype), k.to(key_cache.dtype), v.to(key_cache.dtype)
        # Write first: every query then reads its own chunk back from the cache, so a
        # cached prefix and the new chunk are one code path.
        kernels.write_kv_cache(k, v, key_cache, value_cache, meta.slot_mapping)
        out = self._attend(q, key_cache, value_cache, meta)
        return out.to(out_dtype) if narrow else out

    def _attend(
        self,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        if meta.is_decode_only:
            return kernels.paged_decode_attention(
                q,
                key_cache,
                value_cache,
                meta.block_tables,
                meta.context_lens,
                self.scale,
                self.sliding_window,
                self.logits_soft_cap,
                self.sinks,
                plan=meta.decode_plan(key_cache, self.sliding_window),
            )
        return kernels.paged_prefill_attention(
            q,
            key_cache,
            value_cache,
            meta.block_tables,
            meta.cu_query_lens,
            meta.context_lens,
            self.scale,
            self.sliding_window,
            self.logits_soft_cap,
            self.sinks,
        )
