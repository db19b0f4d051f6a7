"""Gemma 2: the Llama layer with Gemma's own choices. RMSNorm scales by (1 + weight); the
embeddings are multiplied by sqrt(hidden) (rounded to the model dtype); each layer norms its
attention and MLP outputs again before they join the residual stream (four norms a layer);
the softmax scale is query_pre_attn_scalar**-0.5; attention scores are soft-capped
(attn_logit_softcapping) and so are the final logits (final_logit_softcapping); sliding-window
layers alternate with global ones (layer_types); the MLP is gated with gelu (tanh
approximation); the embeddings are tied to the output head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

import quire.kernels as kernels
from quire.model.attention import AttentionMetadata, KVCache
from quire.model.decoder import DecoderLayer, DecoderModel
from quire.model.layers import CheckpointTensors, GatedMLP
from quire.model.model_config import ModelConfig

GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh",)  # transformers' gelu with the tanh approximation


class GeluMLP(GatedMLP):
    """down(gelu_tanh(gate(x)) * up(x)), gate and up fused into one matmul."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.gelu(gate, approximate="tanh") * up)


@dataclass
class SandwichLayer(DecoderLayer):
    """A Gemma layer: input_norm before attention, post_attention_norm after it, post_norm
    (Gemma's pre_feedforward_layernorm) before the MLP, post_feedforward_norm after it."""

    post_attention_norm: torch.Tensor  # [hidden]
    post_feedforward_norm: torch.Tensor  # [hidden]


def gemma_norm_weight(weight: torch.Tensor) -> torch.Tensor:
    """The scale of Gemma's RMSNorm, (1 + weight), as the shared rms_norm kernels take it."""
    return 1.0 + weight


class Gemma2ForCausalLM(DecoderModel):
    """Gemma2ForCausalLM checkpoints."""

    def __init__(self, config: ModelConfig, *args: Any) -> None:
        # args: the checkpoint's tensors and the device, as DecoderModel takes them
        if config.hidden_activation not in GEMMA_ACTIVATIONS:
            raise ValueError(
                f"{config.architecture} hidden_activation {config.hidden_activation!r} is not "
                f"supported (supported: {', '.join(GEMMA_ACTIVATIONS)})"
            )
        super().__init__(config, *args)
        assert isinstance(self.embed, torch.Tensor), "Gemma's embedding table is in floats"
        self.norm = gemma_norm_weight(self.norm)
        # sqrt(hidden) in the model dtype, as transformers multiplies the embeddings by it
        self.embed_scale = torch.tensor(config.hidden_size**0.5).to(self.embed.dtype)

    def load_layer(self, take: CheckpointTensors, i: int) -> SandwichLayer:
        # The base layer takes input_layernorm and post_attention_layernorm; Gemma's third and
        # fourth norms frame the MLP.
        layer = super().load_layer(take, i)
        prefix = f"model.layers.{i}."
        return SandwichLayer(
            input_norm=gemma_norm_weight(layer.input_norm),
            attention=layer.attention,
            post_norm=gemma_norm_weight(take(prefix + "pre_feedforward_layernorm.weight")),
            mlp=layer.mlp,
            post_attention_norm=gemma_norm_weight(layer.post_norm),
            post_feedforward_norm=gemma_norm_weight(
                take(prefix + "post_feedforward_layernorm.weight")
            ),
        )

    def load_mlp(self, take: CheckpointTensors, i: int) -> GatedMLP:
        return GeluMLP.load(take, f"model.layers.{i}.mlp.", self.linear_backend)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states `[num_tokens, hidden]` after the final norm."""
        eps = self.config.rms_norm_eps
        assert isinstance(self.embed, torch.Tensor)
        # residual: [num_tokens, hidden]; x: the next sublayer's input (see DecoderModel)
        residual = F.embedding(input_ids, self.embed) * self.embed_scale
        x = kernels.rms_norm(residual, self.layers[0].input_norm, eps)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            assert isinstance(layer, SandwichLayer)
            if i > 0:
                kernels.add_rms_norm_(x, residual, layer.input_norm, eps)
            x = layer.attention(x, positions, kv_cache, meta.for_layer(i))
            x = kernels.rms_norm(x, layer.post_attention_norm, eps)
            kernels.add_rms_norm_(x, residual, layer.post_norm, eps)
            x = kernels.rms_norm(layer.mlp(x), layer.post_feedforward_norm, eps)
            self.layers_run += 1
        kernels.add_rms_norm_(x, residual, self.norm, eps)
        return x

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits `[n, vocab]`, soft-capped where the config says."""
        logits = super().compute_logits(hidden)
        cap = self.config.final_logit_soft_cap
        return logits if cap is None else torch.tanh(logits / cap) * cap
