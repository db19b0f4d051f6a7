"""Rotary position embeddings (default, linear and Llama-3 frequency scaling)."""

from __future__ import annotations

import math

import torch

from quire.model.model_config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Per-pair inverse frequencies, float32 `[head_dim // 2]`, scaled per rope_type."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
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
    """Precomputed cos/sin tables indexed by absolute position (rotate-half layout); the
    rotation itself is quire.kernels.rotary_embedding_."""

    def __init__(
        self, rope: RopeConfig, head_dim: int, max_positions: int, device: torch.device
    ) -> None:
        inv_freq = inverse_frequencies(rope, head_dim).to(device)
        positions = torch.arange(max_positions, device=device, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)  # [max_positions, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos()  # [max_positions, head_dim], float32
        self.sin = emb.sin()
