"""YaRN rotary scaling (DeepSeek-V2's long-context rope): per-pair frequencies that are
interpolated by `factor` for long wavelengths, kept for short ones and ramped linearly between,
and the attention temperature ("mscale") that goes with them. The formulas are transformers'
(`_compute_yarn_parameters` and DeepSeek-V2's softmax scaling), written over plain numbers so
both the config reader and the rotary tables use them.
"""

from __future__ import annotations

import math

import torch


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's temperature for a context `factor` times the original: 0.1 * mscale * ln(factor)
    + 1, or 1 where the context is not extended."""
    if factor <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


def yarn_attention_factor(
    factor: float, mscale: float | None, mscale_all_dim: float | None
) -> float:
    """What cos and sin are scaled by when the config names no attention_factor: the ratio of
    the two temperatures where both are given (DeepSeek-V2: equal, so 1), else mscale(factor)."""
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor)


def yarn_inverse_frequencies(
    dim: int,  # the rotating dims of a head
    theta: float,
    factor: float,
    original_max_positions: int,
    beta_fast: float,
    beta_slow: float,
    truncate: bool,
) -> torch.Tensor:
    """Per-pair inverse frequencies, float32 `[dim // 2]`: extrapolated (as trained) for pairs
    that turn more than `beta_fast` times over the original context, interpolated (divided by
    `factor`) for those that turn fewer than `beta_slow` times, linearly mixed between."""

    def correction_dim(num_rotations: float) -> float:
        # the pair index whose wavelength fits num_rotations times into the original context
        return (dim * math.log(original_max_positions / (num_rotations * 2 * math.pi))) / (
            2 * math.log(theta)
        )

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no singular ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_share = 1 - ramp
    return interpolation * (1 - extrapolation_share) + extrapolation * extrapolation_share
