"""Multi-head latent attention (DeepSeek-V2), weight-absorbed over the paged latent cache.

Each token caches one vector `[c | k_rope]`: its compressed latent c (kv_lora_rank values,
RMS-normalized) and one rotary key shared by every head (qk_rope_head_dim values). Head h's
key is `[W_UK[h] c | k_rope]` and its value `W_UV[h] c`, W_UK and W_UV being kv_b_proj's two
parts, so

    q . k = (W_UK[h]^T q_nope) . c + q_rope . k_rope,    out[h] = W_UV[h] (sum_j p_j c_j).

With q_nope absorbed through W_UK, attention runs over the cached vectors themselves as
multi-query attention (keys: the whole vector; values: its latent part) and its output goes
through W_UV afterwards: nothing per head is ever expanded or cached. Prefill, chunked prefill
and decode all take this one path (the kernel is quire.kernels.reference_mla).

transformers rotates the rotary dims as interleaved pairs (x0, x1), (x2, x3), ...; Quire's
rotary kernel rotates halves (x_i, x_{i + R/2}). Loading permutes the rows that produce q_rope
and k_rope (evens first, then odds) so the halves are those pairs: q_rope . k_rope is the same
sum, and the cached k_rope is kept in that order.
"""

from __future__ import annotations

import torch

import quire.kernels as kernels
from quire.kernels import reference_mla
from quire.model.attention import AttentionMetadata, KVCache
from quire.model.layers import CheckpointTensors
from quire.model.linear import Linear
from quire.model.model_config import MlaConfig, ModelConfig
from quire.model.rope import RotaryEmbedding

# transformers' DeepseekV2RMSNorm default: q_a_layernorm and kv_a_layernorm do not take the
# config's rms_norm_eps.
LATENT_NORM_EPS = 1e-6


def deinterleave(rows: torch.Tensor, start: int, width: int) -> torch.Tensor:
    """`rows` (dim 0 grouped in runs of `start + width`) with each run's last `width` rows
    reordered evens first, then odds: interleaved rotary pairs into rotate-half halves."""
    run = start + width
    order = torch.cat([torch.arange(0, width, 2), torch.arange(1, width, 2)]) + start
    index = torch.cat([torch.arange(start), order])
    grouped = rows.reshape(-1, run, *rows.shape[1:])
    return grouped[:, index].reshape(rows.shape)


class MlaAttention:
    """q (direct or low-rank) and kv_a projections -> latent norm -> rotary -> the latent
    cache -> absorbed attention -> W_UV -> o projection."""

    def __init__(
        self,
        config: ModelConfig,
        q: Linear | tuple[Linear, torch.Tensor, Linear],  # q_proj, or q_a, its norm, q_b
        kv_a: Linear,  # [kv_lora_rank + qk_rope_head_dim, hidden]
        kv_a_norm: torch.Tensor,  # [kv_lora_rank]
        kv_b: torch.Tensor,  # [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
        o: Linear,  # [hidden, heads * v_head_dim]
        rotary: RotaryEmbedding,
    ) -> None:
        assert config.mla is not None, "MLA attention needs the config's MLA shape"
        mla: MlaConfig = config.mla
        self.mla = mla
        self.num_heads = config.num_heads
        self.q, self.kv_a, self.kv_a_norm, self.o = q, kv_a, kv_a_norm, o
        self.rotary = rotary
        nope, lora = mla.qk_nope_head_dim, mla.kv_lora_rank
        per_head = kv_b.view(self.num_heads, nope + mla.v_head_dim, lora)
        self.w_uk = per_head[:, :nope].contiguous()  # [heads, nope, lora]
        self.w_uv_t = per_head[:, nope:].transpose(1, 2).contiguous()  # [heads, lora, v]
        self.num_kv_b_params = kv_b.numel()

    @property
    def num_params(self) -> int:
        """The projections' weights (q, kv_a, kv_b and o)."""
        q = self.q.num_params if isinstance(self.q, Linear) else self.q[0].num_params
        q += 0 if isinstance(self.q, Linear) else self.q[2].num_params
        return q + self.kv_a.num_params + self.num_kv_b_params + self.o.num_params

    @classmethod
    def load(
        cls,
        take: CheckpointTensors,
        prefix: str,  # e.g. "model.layers.3.self_attn."
        config: ModelConfig,
        backend: str,
        rotary: RotaryEmbedding,
    ) -> MlaAttention:
        """q_proj (or q_a_proj, q_a_layernorm, q_b_proj), kv_a_proj_with_mqa, kv_a_layernorm,
        kv_b_proj and o_proj under `prefix`; attention_bias adds q_a, kv_a and o biases."""
        assert config.mla is not None
        mla = config.mla
        nope, rope = mla.qk_nope_head_dim, mla.qk_rope_head_dim

        def linear(name: str, bias: bool, rope_rows: int | None = None) -> Linear:
            weight = take(f"{prefix}{name}.weight")
            b = take.optional(f"{prefix}{name}.bias", bias)
            if rope_rows is not None:  # the rotary rows follow rope_rows others (per head)
                weight = deinterleave(weight, rope_rows, rope)
                b = None if b is None else deinterleave(b, rope_rows, rope)
            return Linear(weight, b, backend)

        q: Linear | tuple[Linear, torch.Tensor, Linear]
        if mla.q_lora_rank is None:
            q = linear("q_proj", False, nope)
        else:
            q_a = linear("q_a_proj", config.qkv_bias)
            q = (q_a, take(f"{prefix}q_a_layernorm.weight"), linear("q_b_proj", False, nope))
        return cls(
            config,
            q,
            linear("kv_a_proj_with_mqa", config.qkv_bias, mla.kv_lora_rank),
            take(f"{prefix}kv_a_layernorm.weight"),
            take(f"{prefix}kv_b_proj.weight"),
            linear("o_proj", config.o_bias),
            rotary,
        )

    def __call__(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        positions: torch.Tensor,  # [num_tokens] int64
        kv_cache: KVCache,  # (latent_cache,): [num_blocks, block_size, 1, latent_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        mla, num_tokens = self.mla, x.shape[0]
        nope, lora = mla.qk_nope_head_dim, mla.kv_lora_rank
        if isinstance(self.q, Linear):
            q = self.q(x)
        else:
            q_a, q_norm, q_b = self.q
            q = q_b(kernels.rms_norm(q_a(x), q_norm, LATENT_NORM_EPS))
        q = q.view(num_tokens, self.num_heads, nope + mla.qk_rope_head_dim)
        kv = self.kv_a(x)  # [num_tokens, lora + rope]
        # latent: [num_tokens, lora + rope], the normalized latent then the rotary key, as cached
        latent = torch.empty_like(kv)
        latent[:, :lora] = kernels.rms_norm(kv[:, :lora], self.kv_a_norm, LATENT_NORM_EPS)
        latent[:, lora:] = kv[:, lora:]
        kernels.rotary_embedding_(
            positions, q[..., nope:], latent[:, None, lora:], self.rotary.cos, self.rotary.sin
        )
        (latent_cache,) = kv_cache
        # A narrower cache (EngineConfig.kv_cache_dtype) stores the latent rounded to it; the
        # attention then reads the query in it and hands back x's dtype.
        narrow = latent_cache.dtype != x.dtype
        if narrow:
            latent = latent.to(latent_cache.dtype)
        reference_mla.write_latent_cache(latent, latent_cache, meta.slot_mapping)
        # query: [num_tokens, heads, lora + rope], q_nope absorbed through W_UK: [heads, T, lora]
        query = x.new_empty((num_tokens, self.num_heads, mla.latent_dim))
        query[..., :lora] = torch.bmm(q[..., :nope].transpose(0, 1), self.w_uk).transpose(0, 1)
        query[..., lora:] = q[..., nope:]
        attn = reference_mla.paged_mla_attention(
            query.to(latent_cache.dtype) if narrow else query,
            latent_cache,
            meta.block_tables,
            meta.cu_query_lens,
            meta.context_lens,
            lora,
            mla.softmax_scale,
        )  # [num_tokens, heads, lora]
        if narrow:
            attn = attn.to(x.dtype)
        out = torch.bmm(attn.transpose(0, 1), self.w_uv_t)  # [heads, num_tokens, v]
        return self.o(out.transpose(0, 1).reshape(num_tokens, -1))
