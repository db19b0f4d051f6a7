"""Phi-3: the Llama layer with q/k/v and gate/up fused in the checkpoint (self_attn.qkv_proj,
mlp.gate_up_proj, gate rows first), LongRoPE frequency scaling (short and long factors around
original_max_position_embeddings, cos and sin scaled by its attention factor) and partial
rotary where the config has it (quire.model.rope)."""

from __future__ import annotations

from quire.model.decoder import DecoderModel
from quire.model.layers import CheckpointTensors, GatedMLP


class Phi3ForCausalLM(DecoderModel):
    """Phi3ForCausalLM checkpoints."""

    fused_qkv = True

    def load_mlp(self, take: CheckpointTensors, i: int) -> GatedMLP:
        return GatedMLP.load(take, f"model.layers.{i}.mlp.", self.linear_backend, fused=True)
