"""The expert MLPs (reference_experts.expert_mlp's signature) as two grouped GEMMs: torch's
`grouped_mm` multiplies every expert's rows by that expert's weight in one call each for
gate/up and down, with no Python loop over experts or tokens and no device sync (the group
offsets stay a tensor). It computes the loop's bits; `make bench-moe` times the two, and the
backend rule (quire.kernels.backends) takes the loop on the CPU while it is not measured
faster."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quire.kernels.reference_experts import activate, sorted_rows, weighted_sum
from quire.kernels.signatures import ClampedSwiGLU


def expert_mlp(
    x: torch.Tensor,
    gate_up_t: torch.Tensor,
    down_t: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    clamp: ClampedSwiGLU | None = None,
) -> torch.Tensor:
    """gate/up, the activation and down over all experts' sorted rows at once; each row's
    expert's biases gathered and added."""
    groups, rows = sorted_rows(x, gate_up_t, down_t, experts, weights, gate_up_bias, down_bias)
    offsets = torch.cumsum(groups.counts, 0).to(torch.int32)  # end of each expert's rows
    gate_up = F.grouped_mm(rows, gate_up_t, offs=offsets)
    if gate_up_bias is not None:
        gate_up += gate_up_bias[groups.experts]
    out = F.grouped_mm(activate(gate_up, clamp), down_t, offs=offsets)  # [num_pairs, hidden]
    if down_bias is not None:
        out += down_bias[groups.experts]
    return weighted_sum(out, groups, weights).to(x.dtype)
