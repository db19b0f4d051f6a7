"""Llama-family decoder (Llama, Mistral, Qwen2) over a flattened, unpadded token batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import quire.kernels as kernels
from quire.model.attention import AttentionMetadata, PagedAttention
from quire.model.linear import Linear, head_backend, linear_backend
from quire.model.model_config import ModelConfig
from quire.model.rope import RotaryEmbedding

KVCache = tuple[torch.Tensor, torch.Tensor]  # key, value: [num_blocks, block_size, kv_heads, D]


@dataclass
class LayerWeights:
    """One decoder layer, with q/k/v and gate/up fused into single matmuls."""

    input_norm: torch.Tensor
    qkv: Linear  # [(heads + 2 * kv_heads) * D, hidden]
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear  # [2 * intermediate, hidden]
    down: Linear


class LlamaModel:
    """The forward pass: embeddings -> N x (attention + SwiGLU MLP) -> norm -> logits."""

    def __init__(
        self, config: ModelConfig, state: dict[str, torch.Tensor], device: torch.device
    ) -> None:
        self.config = config
        self.device = device
        take = _Taker(state)
        self.embed = take("model.embed_tokens.weight")
        c = config
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        shapes = (  # one decoder layer's qkv, o, gate_up, down: what `auto` is timed on
            (q + 2 * kv, c.hidden_size),
            (c.hidden_size, q),
            (2 * c.intermediate_size, c.hidden_size),
            (c.hidden_size, c.intermediate_size),
        )
        self.linear_backend = linear_backend(self.embed.dtype, device, shapes=shapes)
        self.layers = [self._layer(take, i) for i in range(config.num_layers)]
        self.norm = take("model.norm.weight")
        if config.tie_word_embeddings:
            take.discard("lm_head.weight")
            lm_head = self.embed
        else:
            lm_head = take("lm_head.weight")
        take.finish()
        self.lm_head = Linear(lm_head, None, head_backend(lm_head.dtype, device))
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, config.max_model_len, device)
        self.attn = PagedAttention(
            config.num_heads, config.num_kv_heads, config.head_dim, config.scale
        )
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim

    def _layer(self, take: _Taker, i: int) -> LayerWeights:
        c = self.config
        p = f"model.layers.{i}."
        a = p + "self_attn."
        m = p + "mlp."
        qkv_bias = (
            torch.cat([take(a + "q_proj.bias"), take(a + "k_proj.bias"), take(a + "v_proj.bias")])
            if c.qkv_bias
            else None
        )
        gate_up_bias = (
            torch.cat([take(m + "gate_proj.bias"), take(m + "up_proj.bias")])
            if c.mlp_bias
            else None
        )
        qkv = torch.cat(
            [take(a + "q_proj.weight"), take(a + "k_proj.weight"), take(a + "v_proj.weight")]
        )
        gate_up = torch.cat([take(m + "gate_proj.weight"), take(m + "up_proj.weight")])
        o_bias = take(a + "o_proj.bias") if c.o_bias else None
        down_bias = take(m + "down_proj.bias") if c.mlp_bias else None
        return LayerWeights(
            input_norm=take(p + "input_layernorm.weight"),
            qkv=Linear(qkv, qkv_bias, self.linear_backend),
            o=Linear(take(a + "o_proj.weight"), o_bias, self.linear_backend),
            post_norm=take(p + "post_attention_layernorm.weight"),
            gate_up=Linear(gate_up, gate_up_bias, self.linear_backend),
            down=Linear(take(m + "down_proj.weight"), down_bias, self.linear_backend),
        )

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states `[num_tokens, hidden]` after the final norm."""
        c = self.config
        eps = c.rms_norm_eps
        # residual: [num_tokens, hidden], the stream each sublayer adds into; x: the input of
        # the next sublayer, which add_rms_norm_ overwrites with norm(residual + x).
        residual = F.embedding(input_ids, self.embed)
        x = kernels.rms_norm(residual, self.layers[0].input_norm, eps)
        cos, sin = self.rotary.cos, self.rotary.sin
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            if i > 0:
                kernels.add_rms_norm_(x, residual, layer.input_norm, eps)
            qkv = layer.qkv(x)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            # views into qkv: [num_tokens, heads, head_dim], rotated in place
            q = q.view(-1, c.num_heads, c.head_dim)
            k = k.view(-1, c.num_kv_heads, c.head_dim)
            v = v.view(-1, c.num_kv_heads, c.head_dim)
            kernels.rotary_embedding_(positions, q, k, cos, sin)
            attn = self.attn(q, k, v, kv_cache, meta)
            x = layer.o(attn.reshape(-1, self.q_size))
            kernels.add_rms_norm_(x, residual, layer.post_norm, eps)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            x = layer.down(F.silu(gate) * up)
        kernels.add_rms_norm_(x, residual, self.norm, eps)
        return x

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits `[n, vocab]` for the selected hidden rows `[n, hidden]`."""
        return self.lm_head(hidden).float()


class _Taker:
    """Hands out checkpoint tensors once each, then names anything missing or left over."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state
        self.used: set[str] = set()
        self.missing: list[str] = []

    def __call__(self, name: str) -> torch.Tensor:
        self.used.add(name)
        if name not in self.state:
            self.missing.append(name)
            return torch.empty(0)
        return self.state[name]

    def discard(self, name: str) -> None:
        self.used.add(name)

    def finish(self) -> None:
        if self.missing:
            shown = ", ".join(self.missing[:5])
            raise ValueError(f"checkpoint is missing {len(self.missing)} tensors: {shown}")
        extra = [n for n in self.state if n not in self.used and not n.endswith("inv_freq")]
        if extra:
            raise ValueError(f"checkpoint has {len(extra)} unexpected tensors: {extra[:5]}")
