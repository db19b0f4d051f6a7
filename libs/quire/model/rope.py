"""Rotary position embeddings (default, linear, Llama-3, LongRoPE and YaRN frequency scaling,
and partial rotary: only each head's first dims rotate)."""

from __future__ import annotations

import math

import torch

from quire.model.model_config import RopeConfig
from quire.model.yarn import yarn_inverse_frequencies


def inverse_frequencies(rope: RopeConfig, head_dim: int, max_positions: int) -> torch.Tensor:
    """Per-pair inverse frequencies, float32 `[rotary_dim // 2]`, scaled per rope_type.

    LongRoPE picks its factors once for the model, by the context it serves: the long ones
    where `max_positions` exceeds original_max_position_embeddings, else the short ones. A
    cached key must not depend on how long its sequence later grows (prefix blocks are shared,
    sequences are chunked and recomputed), so the choice is not made per sequence as
    transformers' generate() makes it; the two agree for every sequence when the context is
    capped at original_max_position_embeddings, and for sequences longer than it otherwise.
    """
    dim = rope.rotary_dim(head_dim)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    if rope.rope_type == "longrope":
        is_long = max_positions > rope.original_max_position_embeddings
        factors = torch.tensor(rope.long_factor if is_long else rope.short_factor)
        if factors.numel() != dim // 2:
            raise ValueError(
                f"longrope has {factors.numel()} factors for {dim // 2} rotary pairs per head"
            )
        return 1.0 / (factors * rope.theta**exponents)
    if rope.rope_type == "yarn":
        return yarn_inverse_frequencies(
            dim,
            rope.theta,
            rope.factor,
            rope.original_max_position_embeddings,
            rope.beta_fast,
            rope.beta_slow,
            rope.truncate,
        )
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        old_len = rope.original_max_position_embeddings
        low_freq_wavelen = old_len / rope.low_freq_factor
        high_freq_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


class RotaryEmbedding:
    """Precomputed cos/sin tables indexed by absolute position (rotate-half layout) over each
    head's first `rotary_dim` dims; the rotation itself is quire.kernels.rotary_embedding_."""

    def __init__(
        self, rope: RopeConfig, head_dim: int, max_positions: int, device: torch.device
    ) -> None:
        self.rotary_dim = rope.rotary_dim(head_dim)
        inv_freq = inverse_frequencies(rope, head_dim, max_positions).to(device)
        positions = torch.arange(max_positions, device=device, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)  # [max_positions, rotary_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)
        # [max_positions, rotary_dim], float32; LongRoPE scales both by its attention factor
        self.cos = emb.cos() * rope.attention_factor
        self.sin = emb.sin() * rope.attention_factor
