"""Llama, Mistral and Qwen2: pre-norm attention (q/k/v biases where the config has them) and a
SwiGLU MLP in every layer."""

from __future__ import annotations

from quire.model.decoder import DecoderModel
from quire.model.layers import CheckpointTensors, GatedMLP


class LlamaForCausalLM(DecoderModel):
    """LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM checkpoints."""

    def load_mlp(self, take: CheckpointTensors, i: int) -> GatedMLP:
        prefix = f"model.layers.{i}.mlp."
        return GatedMLP.load(take, prefix, self.linear_backend, bias=self.config.mlp_bias)
