"""Qwen3 (dense): the Llama layer with an RMSNorm over each query and key head before rotary
(q_norm, k_norm), a head_dim of its own (not hidden / heads) and no q/k/v biases unless
attention_bias says so."""

from __future__ import annotations

from quire.model.decoder import DecoderModel
from quire.model.layers import CheckpointTensors, GatedMLP


class Qwen3ForCausalLM(DecoderModel):
    """Qwen3ForCausalLM checkpoints."""

    qk_norm = True

    def load_mlp(self, take: CheckpointTensors, i: int) -> GatedMLP:
        return GatedMLP.load(take, f"model.layers.{i}.mlp.", self.linear_backend)
