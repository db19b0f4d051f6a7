"""A mixture-of-experts layer's expert MLPs over its routed tokens (signatures.ExpertMlp) in
plain torch, one GEMM pair per expert the batch uses in a Python loop over those experts: the
oracle of the grouped (grouped_experts.py) and Triton (triton_experts.py) paths, and the
grouping and checks they share.

Every path sorts the (token, expert) pairs by expert, so each expert multiplies all the rows
routed to it at once; none loops over tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ExpertGroups:
    """The (token, expert) pairs of a batch sorted by expert (stable: token order within)."""

    order: torch.Tensor  # [num_pairs] int64: pair index t * top_k + j of each sorted pair
    tokens: torch.Tensor  # [num_pairs] int64: each sorted pair's token
    counts: torch.Tensor  # [num_experts] int64: pairs routed to each expert


def group_by_expert(experts: torch.Tensor, num_experts: int) -> ExpertGroups:
    """Sort the pairs of `experts` `[num_tokens, top_k]` by expert."""
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    return ExpertGroups(
        order, order // experts.shape[1], torch.bincount(flat, minlength=num_experts)
    )


def check_expert_mlp(
    x: torch.Tensor,
    gate_up_t: torch.Tensor,
    down_t: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
) -> None:
    """Shapes, dtypes and devices of an expert_mlp call (metadata only: no device sync)."""
    num_experts, hidden, two_inter = gate_up_t.shape
    if x.dim() != 2 or x.shape[1] != hidden:
        raise ValueError(f"x must be [num_tokens, {hidden}], got {tuple(x.shape)}")
    if two_inter % 2 or down_t.shape != (num_experts, two_inter // 2, hidden):
        raise ValueError(
            f"down_t must be [{num_experts}, {two_inter // 2}, {hidden}] beside gate_up_t "
            f"{tuple(gate_up_t.shape)}, got {tuple(down_t.shape)}"
        )
    if not x.dtype == gate_up_t.dtype == down_t.dtype:
        raise ValueError(
            f"x, gate_up_t and down_t must share a dtype, got {x.dtype}, {gate_up_t.dtype}, "
            f"{down_t.dtype}"
        )
    if experts.dtype != torch.int64 or experts.dim() != 2 or experts.shape[0] != x.shape[0]:
        raise ValueError(f"experts must be [num_tokens, top_k] int64, got {tuple(experts.shape)}")
    if weights.dtype != torch.float32 or weights.shape != experts.shape:
        raise ValueError(f"weights must be float32 shaped like experts, got {weights.dtype}")
    devices = {t.device for t in (x, gate_up_t, down_t, experts, weights)}
    if len(devices) > 1:
        raise ValueError(f"expert_mlp's tensors must be on one device, got {devices}")


def sorted_rows(
    x: torch.Tensor,
    gate_up_t: torch.Tensor,
    down_t: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
) -> tuple[ExpertGroups, torch.Tensor]:
    """An expert_mlp call checked, its pairs grouped by expert, and the tokens' rows in that
    order: `[num_pairs, hidden]`."""
    check_expert_mlp(x, gate_up_t, down_t, experts, weights)
    groups = group_by_expert(experts, gate_up_t.shape[0])
    return groups, x[groups.tokens]


def weighted_sum(
    out: torch.Tensor,  # [num_pairs, hidden]: expert outputs in sorted order
    groups: ExpertGroups,
    weights: torch.Tensor,  # [num_tokens, top_k] float32
) -> torch.Tensor:
    """Each token's expert outputs times their weights, summed in float32: `[num_tokens,
    hidden]` float32."""
    weighted = out.float() * weights.flatten()[groups.order].unsqueeze(1)
    summed = torch.zeros(weights.shape[0], out.shape[1], dtype=torch.float32, device=out.device)
    return summed.index_add_(0, groups.tokens, weighted)


def expert_mlp(
    x: torch.Tensor,
    gate_up_t: torch.Tensor,
    down_t: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """One GEMM pair per expert that has rows (the loop syncs to read the counts)."""
    groups, rows = sorted_rows(x, gate_up_t, down_t, experts, weights)
    out = torch.empty_like(rows)
    start = 0
    for e, count in enumerate(groups.counts.tolist()):
        if count:
            end = start + count
            gate, up = torch.mm(rows[start:end], gate_up_t[e]).chunk(2, dim=-1)
            torch.mm(F.silu(gate) * up, down_t[e], out=out[start:end])
            start = end
    return weighted_sum(out, groups, weights).to(x.dtype)
