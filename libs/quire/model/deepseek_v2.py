"""DeepSeek-V2 (the V2-Lite shape): multi-head latent attention in every layer
(quire.model.mla; its cache is one latent per token, not K and V per head) and, from layer
first_k_dense_replace on, a mixture of experts: top-k routed experts (the shared expert layer,
quire.model.moe: softmax over the router logits, greedy top-k, not renormalized) scaled by
routed_scaling_factor, plus shared experts every token runs through. The first layers keep a
dense SwiGLU MLP. Routed experts are `mlp.experts.{e}.{gate,up,down}_proj`, the router
`mlp.gate`, the shared experts one SwiGLU `mlp.shared_experts.*` (n_shared_experts wide).
"""

from __future__ import annotations

import torch

from quire.model.decoder import DecoderLayer, DecoderModel
from quire.model.layers import CheckpointTensors, GatedMLP
from quire.model.linear import LayerShapes
from quire.model.mla import MlaAttention
from quire.model.moe import SparseMoE


class SharedExpertsMoE:
    """Routed experts, their weighted sum scaled, plus shared experts over every token."""

    def __init__(self, routed: SparseMoE, shared: GatedMLP, routed_scaling_factor: float) -> None:
        self.routed = routed
        self.shared = shared
        self.routed_scaling_factor = routed_scaling_factor

    @property
    def num_active_params(self) -> int:
        """Weights one token is multiplied by: router, top-k experts and shared experts."""
        return self.routed.num_active_params + self.shared.num_active_params

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`[num_tokens, hidden]` -> the same shape."""
        routed = self.routed(x)
        if self.routed_scaling_factor != 1.0:  # a product of the router weights, factored out
            routed = routed * self.routed_scaling_factor
        return routed + self.shared(x)


class DeepseekV2ForCausalLM(DecoderModel):
    """DeepseekV2ForCausalLM checkpoints."""

    def linear_shapes(self) -> LayerShapes:
        """One layer's q, kv_a, o and dense gate_up, down."""
        c = self.config
        assert c.mla is not None, "a DeepSeek-V2 config always has its MLA shape"
        q_rows = c.num_heads * (c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim)
        return (
            (q_rows, c.mla.q_lora_rank or c.hidden_size),
            (c.mla.latent_dim, c.hidden_size),
            (c.hidden_size, c.num_heads * c.mla.v_head_dim),
            (2 * c.intermediate_size, c.hidden_size),
            (c.hidden_size, c.intermediate_size),
        )

    def load_layer(self, take: CheckpointTensors, i: int) -> DecoderLayer:
        prefix = f"model.layers.{i}."
        attention = MlaAttention.load(
            take, prefix + "self_attn.", self.config, self.linear_backend, self.rotary
        )
        return DecoderLayer(
            input_norm=take(prefix + "input_layernorm.weight"),
            attention=attention,
            post_norm=take(prefix + "post_attention_layernorm.weight"),
            mlp=self.load_mlp(take, i),
        )

    def load_mlp(self, take: CheckpointTensors, i: int) -> SharedExpertsMoE | GatedMLP:
        prefix = f"model.layers.{i}.mlp."
        moe, bias = self.config.moe, self.config.mlp_bias
        if moe is None or i not in moe.sparse_layers:
            return GatedMLP.load(take, prefix, self.linear_backend, bias)
        routed = SparseMoE.load(take, prefix, moe, ("gate_proj", "up_proj", "down_proj"))
        shared = GatedMLP.load(take, prefix + "shared_experts.", self.linear_backend, bias)
        return SharedExpertsMoE(routed, shared, moe.routed_scaling_factor)
