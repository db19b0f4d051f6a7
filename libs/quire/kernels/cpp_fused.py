"""The fused norm and rotary ops (signatures.FusedNormRotary) in C++ on the CPU
(csrc/fused_ops_cpu.cpp), one pass over the rows instead of ~8 torch ops per norm and ~15 per
rotary call.

They round every intermediate as the torch reference (reference_fused.py) does, bfloat16
converted by its bits with c10's rounding (nearest even, NaN to 0x7FC0), so rotary embeddings
agree with it bit for bit and RMSNorm differs only in the order of its float32 sum of squares.
"""

from __future__ import annotations

import torch

from quire.kernels import cpp_attention


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    cpp_attention.require_loaded()
    return torch.ops.quire_cpu.rms_norm(x, weight, float(eps))


def add_rms_norm_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    cpp_attention.require_loaded()
    torch.ops.quire_cpu.add_rms_norm_(x, residual, weight, float(eps))


def rotary_embedding_(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> None:
    cpp_attention.require_loaded()
    torch.ops.quire_cpu.rotary_embedding_(positions, query, key, cos, sin)
