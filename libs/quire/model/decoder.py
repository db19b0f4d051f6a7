"""DecoderModel: the forward pass every supported architecture shares, over a flattened,
unpadded token batch: embeddings -> N x (attention + MLP) -> norm -> logits.

An architecture is a subclass that says what its layers use (`qk_norm`) and how one layer's
MLP is built from its checkpoint's names (`load_mlp`), out of the shared layers
(quire.model.layers, quire.model.moe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

import quire.kernels as kernels
from quire.model import fused_layer
from quire.model.attention import AttentionMetadata, KVCache, PagedAttention
from quire.model.layers import Attention, CheckpointTensors
from quire.model.linear import LayerShapes, head_backend, linear_backend
from quire.model.model_config import ModelConfig
from quire.model.quantized_linear import (
    QuantizedLinear,
    QuantizedTensor,
    Weight,
    embedding,
    make_linear,
)
from quire.model.rope import RotaryEmbedding


class Mlp(Protocol):
    """A layer's MLP: GatedMLP or SparseMoE."""

    @property
    def num_active_params(self) -> int:
        """Weights one token is multiplied by (FLOP counts)."""
        ...

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`[num_tokens, hidden]` -> the same shape."""
        ...


class SelfAttention(Protocol):
    """A layer's attention over its paged cache: Attention or MlaAttention."""

    @property
    def num_params(self) -> int:
        """The projections' weights (FLOP counts)."""
        ...

    def __call__(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        """`[num_tokens, hidden]` -> the same shape, this step's cache entries written."""
        ...


@dataclass
class DecoderLayer:
    """One pre-norm decoder layer: x += attention(norm(x)); x += mlp(norm(x))."""

    input_norm: torch.Tensor  # [hidden]
    attention: SelfAttention
    post_norm: torch.Tensor  # [hidden]
    mlp: Mlp


class DecoderModel:
    """The weights of one checkpoint and the forward pass over them."""

    qk_norm = False  # an RMSNorm over each query and key head before rotary (Qwen3)
    fused_qkv = False  # the checkpoint stores self_attn.qkv_proj, not q/k/v_proj (Phi-3)

    def __init__(self, config: ModelConfig, state: dict[str, Weight], device: torch.device) -> None:
        self.config = config
        self.device = device
        # Decoder layers run so far: a liveness signal that moves inside a long step (a big
        # model's prefill chunk), read by the executor's heartbeat from another thread.
        self.layers_run = 0
        take = CheckpointTensors(state)
        self.embed = take.weight("model.embed_tokens.weight")  # float or quantized
        self.linear_backend = linear_backend(self.embed.dtype, device, shapes=self.linear_shapes())
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, config.max_model_len, device)
        # the sliding layers' own rotary table where their rope differs (Gemma 3)
        self.local_rotary = (
            RotaryEmbedding(config.local_rope, config.head_dim, config.max_model_len, device)
            if config.local_rope is not None
            else self.rotary
        )
        self.layers = [self.load_layer(take, i) for i in range(config.num_layers)]
        # Each layer as one C++ call, where every layer qualifies (quire.model.fused_layer);
        # None: the layer-by-layer path below.
        self.fused_layers = fused_layer.fuse(self.layers, device)
        self.norm = take("model.norm.weight")
        if config.tie_word_embeddings:
            take.discard("lm_head.weight")
            lm_head = self.embed
        else:
            lm_head = take.weight("lm_head.weight")
        take.finish()
        self.lm_head = make_linear(lm_head, None, head_backend(lm_head.dtype, device))
        if config.tie_word_embeddings and isinstance(self.lm_head, QuantizedLinear):
            # one copy of a tied table: the head's (make_linear may have interleaved it; the
            # embedding reads either layout)
            (head,) = self.lm_head.parts
            assert isinstance(head, QuantizedTensor), "a quantized table stays in blocks"
            self.embed = head

    def linear_shapes(self) -> LayerShapes:
        """One decoder layer's qkv, o, gate_up, down: what the `auto` backend is timed on."""
        c = self.config
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        return (
            (q + 2 * kv, c.hidden_size),
            (c.hidden_size, q),
            (2 * c.intermediate_size, c.hidden_size),
            (c.hidden_size, c.intermediate_size),
        )

    def layer_paged_attention(self, i: int) -> PagedAttention:
        """Layer `i`'s paged attention: the model's heads and scale, the layer's window and
        the model's attention soft cap."""
        c = self.config
        return PagedAttention(
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.scale,
            c.attention.window(i),
            c.attention.logits_soft_cap,
        )

    def load_layer(self, take: CheckpointTensors, i: int) -> DecoderLayer:
        """Layer `i`: its norms and `self_attn` under the names every supported architecture
        uses, and the MLP this architecture's `load_mlp` builds."""
        prefix = f"model.layers.{i}."
        attention = Attention.load(
            take,
            prefix + "self_attn.",
            self.config,
            self.linear_backend,
            self.local_rotary if self.config.attention.window(i) else self.rotary,
            self.layer_paged_attention(i),
            qk_norm=self.qk_norm,
            fused=self.fused_qkv,
        )
        return DecoderLayer(
            input_norm=take(prefix + "input_layernorm.weight"),
            attention=attention,
            post_norm=take(prefix + "post_attention_layernorm.weight"),
            mlp=self.load_mlp(take, i),
        )

    def load_mlp(self, take: CheckpointTensors, i: int) -> Mlp:
        """Layer `i`'s MLP, its tensors taken by this architecture's names."""
        raise NotImplementedError

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
        # residual: [num_tokens, hidden], the stream each sublayer adds into; x: the input of
        # the next sublayer, which add_rms_norm_ overwrites with norm(residual + x).
        residual = embedding(input_ids, self.embed)
        x = kernels.rms_norm(residual, self.layers[0].input_norm, eps)
        fused = self.fused_layers if fused_layer.runs_fused(x.device) else None
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            if fused is not None:  # the same kernels in the same order, in one call
                x = fused[i](x, residual, i > 0, eps, positions, kv_cache, meta.for_layer(i))
            else:
                if i > 0:
                    kernels.add_rms_norm_(x, residual, layer.input_norm, eps)
                x = layer.attention(x, positions, kv_cache, meta.for_layer(i))
                kernels.add_rms_norm_(x, residual, layer.post_norm, eps)
                x = layer.mlp(x)
            self.layers_run += 1
        kernels.add_rms_norm_(x, residual, self.norm, eps)
        return x

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits `[n, vocab]` for the selected hidden rows `[n, hidden]`."""
        return self.lm_head(hidden).float()
