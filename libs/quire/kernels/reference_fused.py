"""The fused norm and rotary ops (signatures.FusedNormRotary) in plain torch: the oracle, the
CPU fallback and what CUDA runs.

transformers' own op order, so that greedy outputs match its `generate()`: RMSNorm normalizes in
float32, casts back, then scales; rotary embeddings rotate half the head with cos and sin cast
to the model dtype.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    residual.add_(x)
    x.copy_(rms_norm(residual, weight, eps))


def rotary_embedding_(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> None:
    c = cos[positions].unsqueeze(1).to(query.dtype)
    s = sin[positions].unsqueeze(1).to(query.dtype)
    query.copy_(query * c + _rotate_half(query) * s)
    key.copy_(key * c + _rotate_half(key) * s)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
