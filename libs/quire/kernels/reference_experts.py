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

from quire.kernels.signatures import ClampedSwiGLU


@dataclass(frozen=True)
class ExpertGroups:
    """The (token, expert) pairs of a batch sorted by expert (stable: token order within)."""

    order: torch.Tensor  # [num_pairs] int64: pair index t * top_k + j of each sorted pair
    tokens: torch.Tensor  # [num_pairs] int64: each sorted pair's token
    counts: torch.Tensor  # [num_experts] int64: pairs routed to each expert
    experts: torch.Tensor  # [num_pairs] int64: each sorted pair's expert


def group_by_expert(experts: torch.Tensor, num_experts: int) -> ExpertGroups:
    """Sort the pairs of `experts` `[num_tokens, top_k]` by expert."""
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    return ExpertGroups(
        order, order // experts.shape[1], torch.bincount(flat, minlength=num_experts), flat[order]
    )


def activate(gate_up: torch.Tensor, clamp: ClampedSwiGLU | None) -> torch.Tensor:
    """An expert's activation over its gate/up rows `[rows, 2 * intermediate]` (gate columns
    first): SwiGLU, or gpt-oss's clamped form (in transformers' order of operations)."""
    gate, up = gate_up.chunk(2, dim=-1)
    if clamp is None:
        return F.silu(gate) * up
    gate = gate.clamp(max=clamp.limit)
    up = up.clamp(min=-clamp.limit, max=clamp.limit)
    return (up + 1) * (gate * torch.sigmoid(gate * clamp.alpha))


def check_expert_mlp(
    x: torch.Tensor,
    gate_up_t: torch.Tensor,
    down_t: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
) -> None:
    """Shapes, dtypes and devices of an expert_mlp call (metadata only: no device sync)."""
    num_experts, hidden, two_inter = gate_up_t.shape
    for name, bias, shape in (
        ("gate_up_bias", gate_up_bias, (num_experts, two_inter)),
        ("down_bias", down_bias, (num_experts, hidden)),
    ):
        if bias is not None and (bias.shape != shape or bias.dtype != x.dtype):
            raise ValueError(
                f"{name} must be {list(shape)} {x.dtype}, got {tuple(bias.shape)} {bias.dtype}"
            )
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
    biases = tuple(b for b in (gate_up_bias, down_bias) if b is not None)
    devices = {t.device for t in (x, gate_up_t, down_t, experts, weights, *biases)}
    if len(devices) > 1:
        raise ValueError(f"expert_mlp's tensors must be on one device, got {devices}")


def sorted_rows(
    x: torch.Tensor,
    gate_up_t: torch.Tensor,
    down_t: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
) -> tuple[ExpertGroups, torch.Tensor]:
    """An expert_mlp call checked, its pairs grouped by expert, and the tokens' rows in that
    order: `[num_pairs, hidden]`."""
    check_expert_mlp(x, gate_up_t, down_t, experts, weights, gate_up_bias, down_bias)
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
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    clamp: ClampedSwiGLU | None = None,
) -> torch.Tensor:
    """One GEMM pair per expert that has rows (the loop syncs to read the counts)."""
    groups, rows = sorted_rows(x, gate_up_t, down_t, experts, weights, gate_up_bias, down_bias)
    out = torch.empty_like(rows)
    start = 0
    for e, count in enumerate(groups.counts.tolist()):
        if count:
            end = start + count
            gate_up = torch.mm(rows[start:end], gate_up_t[e])
            if gate_up_bias is not None:
                gate_up += gate_up_bias[e]
            torch.mm(activate(gate_up, clamp), down_t[e], out=out[start:end])
            if down_bias is not None:
                out[start:end] += down_bias[e]
            start = end
    return weighted_sum(out, groups, weights).to(x.dtype)
