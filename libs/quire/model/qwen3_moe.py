"""Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm) with a sparse mixture-of-experts MLP in
the layers the config makes sparse (every decoder_sparse_step-th, minus mlp_only_layers), a
dense SwiGLU MLP in the others. Experts are `mlp.experts.{e}.{gate,up,down}_proj`, the router
`mlp.gate`; norm_topk_prob renormalizes the top-k router weights."""

from __future__ import annotations

from quire.model.decoder import DecoderModel
from quire.model.layers import CheckpointTensors, GatedMLP
from quire.model.moe import SparseMoE


class Qwen3MoeForCausalLM(DecoderModel):
    """Qwen3MoeForCausalLM checkpoints."""

    qk_norm = True

    def load_mlp(self, take: CheckpointTensors, i: int) -> SparseMoE | GatedMLP:
        prefix = f"model.layers.{i}.mlp."
        moe = self.config.moe
        if moe is not None and i in moe.sparse_layers:
            return SparseMoE.load(take, prefix, moe, ("gate_proj", "up_proj", "down_proj"))
        return GatedMLP.load(take, prefix, self.linear_backend)
