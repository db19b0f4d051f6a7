"""gpt-oss: Llama-shaped attention with biases on q/k/v/o and a learned sink logit per head
(quire.kernels.signatures: a value-less logit in every softmax's denominator), sliding-window
and global layers alternating, YaRN rotary, and a sparse mixture of experts in every layer: a
biased router whose top-k logits are softmaxed, experts with biases and a clamped SwiGLU
(signatures.ClampedSwiGLU).

Checkpoint names: `self_attn.sinks`; `mlp.router.{weight,bias}`; the experts stacked per layer
as `mlp.experts.gate_up_proj` `[experts, hidden, 2 * intermediate]` (x @ W; gate and up columns
interleaved: gate at even columns, up at odd), `gate_up_proj_bias`, `down_proj`
`[experts, intermediate, hidden]` and `down_proj_bias`. The released checkpoints store the
experts in MXFP4; those load once dequantized to bfloat16 safetensors (ModelConfig refuses a
checkpoint that names a quantization_config).
"""

from __future__ import annotations

import torch

from quire.model.decoder import DecoderLayer, DecoderModel
from quire.model.layers import Attention, CheckpointTensors
from quire.model.moe import SparseMoE


def _deinterleave(gate_up: torch.Tensor) -> torch.Tensor:
    """Gate/up columns interleaved along the last dim (gate even, up odd) -> gate columns
    first, then up: the layout every other expert path takes."""
    return torch.cat([gate_up[..., 0::2], gate_up[..., 1::2]], dim=-1)


class GptOssForCausalLM(DecoderModel):
    """GptOssForCausalLM checkpoints."""

    def load_layer(self, take: CheckpointTensors, i: int) -> DecoderLayer:
        layer = super().load_layer(take, i)
        assert isinstance(layer.attention, Attention)
        # Sinks stay float32 whatever the model's dtype: they enter the float32 softmax.
        layer.attention.paged.sinks = take(f"model.layers.{i}.self_attn.sinks").float()
        return layer

    def load_mlp(self, take: CheckpointTensors, i: int) -> SparseMoE:
        assert self.config.moe is not None, "a gpt-oss config always has experts"
        prefix = f"model.layers.{i}.mlp."
        # SparseMoE takes [experts, out, in] weights; gpt-oss stores x @ W layouts
        gate_up = _deinterleave(take(prefix + "experts.gate_up_proj")).transpose(1, 2)
        down = take(prefix + "experts.down_proj").transpose(1, 2)
        return SparseMoE(
            self.config.moe,
            take(prefix + "router.weight"),
            gate_up,
            down,
            router_bias=take(prefix + "router.bias"),
            gate_up_bias=_deinterleave(take(prefix + "experts.gate_up_proj_bias")),
            down_bias=take(prefix + "experts.down_proj_bias"),
        )
