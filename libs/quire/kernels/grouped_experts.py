"""The expert MLPs (reference_experts.expert_mlp's signature) as two grouped GEMMs: torch's
`grouped_mm` multiplies every expert's rows by that expert's weight in one call each for
gate/up and down, with no Python loop over experts or tokens and no device sync (the group
offsets stay a tensor). It computes the loop's bits; `make bench-moe` times the two, and the
backend rule (quire.kernels.backends) takes the loop on the CPU while it is not measured
faster."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quire.kernels.reference_experts import sorted_rows, weighted_sum


def expert_mlp(
    x: torch.Tensor,
    gate_up_t: torch.Tensor,
    down_t: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """gate/up, SiLU-and-multiply and down over all experts' sorted rows at once."""
    groups, rows = sorted_rows(x, gate_up_t, down_t, experts, weights)
    offsets = torch.cumsum(groups.counts, 0).to(torch.int32)  # end of each expert's rows
    gate, up = F.grouped_mm(rows, gate_up_t, offs=offsets).chunk(2, dim=-1)
    out = F.grouped_mm(F.silu(gate) * up, down_t, offs=offsets)  # [num_pairs, hidden]
    return weighted_sum(out, groups, weights).to(x.dtype)
