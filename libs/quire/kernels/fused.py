"""Fused elementwise parts of a decoder layer: RMSNorm (with its residual add) and rotary
embeddings, in C++ on the CPU (csrc/fused_ops_cpu.cpp) with these torch references.

The references are transformers' op order (normalize in float32, cast back, then scale;
rotate-half with cos/sin in the model dtype) and are what CUDA and the "torch" backend run;
the C++ versions round every intermediate the same way, so rotary embeddings agree bit for
bit and RMSNorm differs only in the order of its float32 sum of squares. One pass over the
rows instead of ~8 torch ops per norm and ~15 per rotary call; the backend is chosen per
call by quire.kernels.kernel_backend, like the attention kernels.
"""

from __future__ import annotations

import torch

from quire.kernels import cpp_attention


def _use_cpp(x: torch.Tensor) -> bool:
    from quire.kernels import kernel_backend

    return kernel_backend(x.device) == "cpp"


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x: [num_tokens, hidden]; weight: [hidden]
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm_reference_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    # in place: residual += x (in its dtype), then x = rms_norm(residual)
    residual.add_(x)
    x.copy_(rms_norm_reference(residual, weight, eps))


def rotary_embedding_reference_(
    positions: torch.Tensor,  # [num_tokens] int64
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim], rotated in place
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim], rotated in place
    cos: torch.Tensor,  # [max_positions, head_dim] float32
    sin: torch.Tensor,
) -> None:
    c = cos[positions].unsqueeze(1).to(query.dtype)
    s = sin[positions].unsqueeze(1).to(query.dtype)
    query.copy_(query * c + _rotate_half(query) * s)
    key.copy_(key * c + _rotate_half(key) * s)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * rms_normalized(x), a new `[num_tokens, hidden]` tensor."""
    if _use_cpp(x):
        cpp_attention.require_loaded()
        return torch.ops.quire_cpu.rms_norm(x, weight, float(eps))
    return rms_norm_reference(x, weight, eps)


def add_rms_norm_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    """In place: `residual += x`, then `x = rms_norm(residual)` (the next sublayer's input)."""
    if _use_cpp(x):
        cpp_attention.require_loaded()
        torch.ops.quire_cpu.add_rms_norm_(x, residual, weight, float(eps))
    else:
        add_rms_norm_reference_(x, residual, weight, eps)


def rotary_embedding_(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> None:
    """Rotate query and key (rotate-half layout) by their positions' angles, in place."""
    if _use_cpp(query):
        cpp_attention.require_loaded()
        torch.ops.quire_cpu.rotary_embedding_(positions, query, key, cos, sin)
    else:
        rotary_embedding_reference_(positions, query, key, cos, sin)
