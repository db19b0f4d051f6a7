"""Gemma 3 (text): Gemma 2's layer (see quire.model.gemma2) with an RMSNorm over each query and
key head before rotary (q_norm, k_norm, also scaling by 1 + weight), one global layer every
sliding_window_pattern layers (layer_types), a rope base per layer type (rope_local_base_freq
for the sliding layers) and no attention soft cap (transformers' Gemma 3 attention ignores
attn_logit_softcapping)."""

from __future__ import annotations

from quire.model.gemma2 import Gemma2ForCausalLM, SandwichLayer, gemma_norm_weight
from quire.model.layers import Attention, CheckpointTensors


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma3ForCausalLM checkpoints (the text model)."""

    qk_norm = True

    def load_layer(self, take: CheckpointTensors, i: int) -> SandwichLayer:
        layer = super().load_layer(take, i)
        attention = layer.attention
        assert isinstance(attention, Attention) and attention.qk_norm is not None
        q_weight, k_weight = attention.qk_norm
        attention.qk_norm = (gemma_norm_weight(q_weight), gemma_norm_weight(k_weight))
        return layer
