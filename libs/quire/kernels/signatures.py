"""Each kernel's signature, written once: one Protocol per kernel family.

A backend implements a family as a module holding these functions under these names: the
torch reference (reference.py, reference_fused.py, reference_experts.py), the C++ CPU kernels
(cpp_attention.py, cpp_fused.py, packed_linear.py), torch's grouped GEMM (grouped_experts.py) and
the Triton kernels (triton_attention.py, triton_cache.py, triton_experts.py).
quire.kernels.backends picks the module for a call, and mypy checks there that each module
fits its family. Arguments, shapes and meaning are documented here only; a backend's own
docstrings say what is particular to it (what it checks, what it trusts, how it computes).

The paged KV cache (one layer): key_cache and value_cache are [num_blocks, block_size,
num_kv_heads, head_dim]. Slot s is block s // block_size at offset s % block_size. A sequence's
block table row lists its blocks in logical order, so its token at position p is in block
block_table[p // block_size] at offset p % block_size; entries past the blocks it uses are
ignored but must still be valid block ids. Attention math runs in float32 whatever the cache
dtype; outputs have the query's dtype. Grouped-query attention: query head h reads kv head
h // (num_heads // num_kv_heads).

Per layer, attention may be windowed and soft-capped. With `sliding_window` W, the token at
position p attends to positions max(0, p - W + 1)..p only (its W latest, itself included), so
block table entries wholly before that are never read (they may name any valid block: a
sequence whose blocks fell out of every window gives them back). With `logits_soft_cap` c, each
scaled score s becomes c * tanh(s / c) before the softmax (Gemma 2). With `sinks` (gpt-oss),
query head h's softmax has one more logit, sinks[h], with no value: every weight is
exp(s_j) / (sum_i exp(s_i) + exp(sinks[h])), so a head may attend to less than all of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


class PagedAttention(Protocol):
    """Attention of new tokens over their sequences' paged caches."""

    def paged_decode_attention(
        self,
        query: torch.Tensor,  # [num_seqs, num_heads, head_dim]: one new token per sequence
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
        context_lens: torch.Tensor,  # [num_seqs] int32, >= 1: the current token included
        scale: float,  # applied to q . k before the softmax
        sliding_window: int | None = None,  # >= 1: attend to the latest W positions; None: all
        logits_soft_cap: float | None = None,  # > 0: c * tanh(score / c); None: no cap
        sinks: torch.Tensor | None = None,  # [num_heads] float32: a value-less logit per head
    ) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
        """Attention of one new token per sequence over that sequence's paged cache.

        The token's key and value are already in the cache: it sits at position
        context_len - 1 and attends to positions 0..context_len-1 (the last sliding_window of
        them with a window).
        """
        ...

    def paged_prefill_attention(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]: the chunks back to back
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
        cu_query_lens: torch.Tensor,  # [num_seqs + 1] int32: prefix sums of the chunk lengths
        context_lens: torch.Tensor,  # [num_seqs] int32: cached prefix + chunk
        scale: float,  # applied to q . k before the softmax
        sliding_window: int | None = None,  # >= 1: attend to the latest W positions; None: all
        logits_soft_cap: float | None = None,  # > 0: c * tanh(score / c); None: no cap
        sinks: torch.Tensor | None = None,  # [num_heads] float32: a value-less logit per head
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Causal attention of each sequence's chunk of new tokens over its paged cache.

        Sequence s contributes q_s = cu_query_lens[s+1] - cu_query_lens[s] query tokens (q_s may
        be 0), already written to the cache after a cached prefix of context_lens[s] - q_s
        tokens. Chunk token i sits at position context_lens[s] - q_s + i and attends to every
        position up to its own (the last sliding_window of them with a window). Decode is the
        case q_s = 1.
        """
        ...


class KVCacheWrite(Protocol):
    """This step's keys and values into the paged cache."""

    def write_kv_cache(
        self,
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim], a view or not
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim], a view or not
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        slot_mapping: torch.Tensor,  # [num_tokens] int64, distinct slots
    ) -> None:
        """Scatter key and value into the caches at slot_mapping, in place."""
        ...


class BlockCopy(Protocol):
    """Whole cache blocks copied within every layer's caches (copy-on-write forks)."""

    def copy_blocks(
        self,
        key_caches: Sequence[torch.Tensor],  # num_layers x [num_blocks, block_size, kv_heads, D]
        value_caches: Sequence[torch.Tensor],  # num_layers x [num_blocks, block_size, kv_heads, D]
        block_mapping: torch.Tensor,  # [num_pairs, 2] int64, rows of (src, dst)
    ) -> None:
        """Copy block src to block dst in every layer's caches, in place.

        Destinations are distinct and never also sources, so that pairs are independent and
        may be copied in parallel.
        """
        ...


class FusedNormRotary(Protocol):
    """The elementwise parts of a decoder layer: RMSNorm (with its residual add) and rotary
    embeddings, as transformers computes them (normalize in float32, cast back, then scale;
    rotate-half with cos and sin cast to the model dtype)."""

    def rms_norm(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        weight: torch.Tensor,  # [hidden], x's dtype
        eps: float,
    ) -> torch.Tensor:  # [num_tokens, hidden], a new tensor
        """weight * rms_normalized(x)."""
        ...

    def add_rms_norm_(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        residual: torch.Tensor,  # [num_tokens, hidden]
        weight: torch.Tensor,  # [hidden]
        eps: float,
    ) -> None:
        """In place: `residual += x` (in its dtype), then `x = rms_norm(residual)`, the next
        sublayer's input."""
        ...

    def rotary_embedding_(
        self,
        positions: torch.Tensor,  # [num_tokens] int64
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim], rotated in place
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim], rotated in place
        cos: torch.Tensor,  # [max_positions, head_dim] float32
        sin: torch.Tensor,  # [max_positions, head_dim] float32
    ) -> None:
        """Rotate query and key (rotate-half layout) by their positions' angles, in place."""
        ...


class PackedLinear(Protocol):
    """y = x W^T + b on a weight packed once into tiles of output columns (the layout of
    packed_linear.pack_weight). Its oracle is F.linear on the unpacked weight."""

    def packed_linear(
        self,
        x: torch.Tensor,  # [num_rows, in_features]
        packed: torch.Tensor,  # from pack_weight, x's dtype
        bias: torch.Tensor | None,  # [out_features], x's dtype
        out_features: int,
    ) -> torch.Tensor:  # [num_rows, out_features], x's dtype
        """x @ W^T + bias for the weight `packed` holds."""
        ...


@dataclass(frozen=True)
class ClampedSwiGLU:
    """gpt-oss's expert activation in place of SwiGLU's silu(gate) * up: gate clamped above at
    `limit`, up clamped to [-limit, limit], then (up + 1) * (gate * sigmoid(alpha * gate))."""

    alpha: float
    limit: float


class ExpertMlp(Protocol):
    """A mixture-of-experts layer's SwiGLU experts over its routed tokens. Its oracle is the
    per-expert loop of reference_experts.py."""

    def expert_mlp(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        gate_up_t: torch.Tensor,  # [num_experts, hidden, 2 * intermediate], gate columns first
        down_t: torch.Tensor,  # [num_experts, intermediate, hidden]
        experts: torch.Tensor,  # [num_tokens, top_k] int64: each token's experts
        weights: torch.Tensor,  # [num_tokens, top_k] float32: their router weights
        gate_up_bias: torch.Tensor | None = None,  # [num_experts, 2 * intermediate], x's dtype
        down_bias: torch.Tensor | None = None,  # [num_experts, hidden], x's dtype
        clamp: ClampedSwiGLU | None = None,  # gpt-oss's activation; None: SwiGLU
    ) -> torch.Tensor:  # [num_tokens, hidden], x's dtype
        """sum_j weights[t, j] * down_e(act(gate_up_e(x[t]))), e = experts[t, j], each
        projection plus its bias where given, act SwiGLU (silu(gate) * up) or `clamp`'s,
        summed in float32 and rounded to x's dtype once."""
        ...
