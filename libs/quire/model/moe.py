"""Sparse mixture-of-experts MLP: a router picks each token's top-k SwiGLU experts and the
token's output is their outputs weighted by the router's probabilities.

The experts run grouped (quire.kernels.expert_mlp): the (token, expert) pairs are sorted by
expert, each expert multiplies all the rows routed to it at once (a loop over the experts on
the CPU, a Triton grouped GEMM on CUDA), and the weighted rows are added back to their tokens. `reference_sparse_moe` is the plain oracle of the whole layer:
every expert over every token, masked.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import quire.kernels as kernels
from quire.kernels.reference_experts import activate
from quire.model.layers import CheckpointTensors
from quire.model.model_config import MoeConfig

# checkpoint names of one expert's gate, up and down projections (Qwen3-MoE, Mixtral)
ExpertNames = tuple[str, str, str]


def route(
    router_logits: torch.Tensor,  # [num_tokens, num_experts]
    top_k: int,
    normalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's experts `[num_tokens, top_k]` int64 and their weights (float32): softmax
    over all experts, the top k, renormalized to sum to 1 when `normalize` (which equals a
    softmax over the top k logits, gpt-oss's rule)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights /= weights.sum(dim=-1, keepdim=True)
    return experts, weights


class SparseMoE:
    """Router + stacked expert weights (gate and up fused per expert)."""

    def __init__(
        self,
        config: MoeConfig,
        router: torch.Tensor,  # [num_experts, hidden]
        gate_up: torch.Tensor,  # [num_experts, 2 * intermediate, hidden]
        down: torch.Tensor,  # [num_experts, hidden, intermediate]
        router_bias: torch.Tensor | None = None,  # [num_experts] (gpt-oss)
        gate_up_bias: torch.Tensor | None = None,  # [num_experts, 2 * intermediate]
        down_bias: torch.Tensor | None = None,  # [num_experts, hidden]
    ) -> None:
        self.top_k = config.top_k
        self.normalize = config.normalize_top_k
        self.num_experts = config.num_experts
        self.clamp = config.clamp
        # Routing is a discrete choice: logits from a 16-bit product tie or swap places where
        # float32's would not, so the router runs in float32 (it is [num_experts, hidden]).
        self.router = router.float()
        self.router_bias = None if router_bias is None else router_bias.float()
        self.gate_up_bias = gate_up_bias
        self.down_bias = down_bias
        # Transposed, [E, in, out]: each expert's product is a plain x @ W_t (NN GEMM), the
        # layout quire.model.linear's torch backend keeps for the same reason on the CPU.
        self.gate_up_t = gate_up.transpose(1, 2).contiguous()
        self.down_t = down.transpose(1, 2).contiguous()

    @property
    def num_active_params(self) -> int:
        """Weights one token is multiplied by: the router and its top_k experts."""
        per_expert = self.gate_up_t[0].numel() + self.down_t[0].numel()
        return self.router.numel() + self.top_k * per_expert

    @classmethod
    def load(
        cls,
        take: CheckpointTensors,
        prefix: str,  # e.g. "model.layers.3.mlp." or "model.layers.3.block_sparse_moe."
        config: MoeConfig,
        expert_names: ExpertNames,
    ) -> SparseMoE:
        """`{prefix}gate.weight` (the router) and `{prefix}experts.{e}.{name}.weight`."""
        gate, up, down = expert_names
        experts = [f"{prefix}experts.{e}." for e in range(config.num_experts)]
        gate_up = torch.stack(
            [torch.cat([take(f"{e}{gate}.weight"), take(f"{e}{up}.weight")]) for e in experts]
        )
        down_w = torch.stack([take(f"{e}{down}.weight") for e in experts])
        return cls(config, take(prefix + "gate.weight"), gate_up, down_w)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's experts and their weights (`route`) from the float32 router."""
        logits = F.linear(x.float(), self.router, self.router_bias)
        return route(logits, self.top_k, self.normalize)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`[num_tokens, hidden]` -> the experts' weighted sum, same shape."""
        experts, weights = self.route(x)
        # Weighted and summed per token in float32, rounded once to the activation dtype.
        return kernels.expert_mlp(
            x,
            self.gate_up_t,
            self.down_t,
            experts,
            weights,
            self.gate_up_bias,
            self.down_bias,
            self.clamp,
        )


def reference_sparse_moe(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """The oracle of `SparseMoE.__call__`: each expert run densely over all tokens, its
    output kept with the router's weight where the token chose it, else with weight 0."""
    experts, weights = moe.route(x)
    out = torch.zeros_like(x, dtype=torch.float32)
    for e in range(moe.num_experts):
        # weight_e: [num_tokens], the router weight of expert e for each token (0 if unchosen)
        weight_e = (weights * (experts == e)).sum(dim=-1)
        gate_up = x @ moe.gate_up_t[e]
        if moe.gate_up_bias is not None:
            gate_up = gate_up + moe.gate_up_bias[e]
        expert_out = activate(gate_up, moe.clamp) @ moe.down_t[e]
        if moe.down_bias is not None:
            expert_out = expert_out + moe.down_bias[e]
        out += weight_e.unsqueeze(1) * expert_out.float()
    return out.to(x.dtype)
