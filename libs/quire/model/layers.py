"""The layers every architecture is assembled from, each built from checkpoint tensors by name:
self-attention over the paged cache (fused qkv, optional per-head q/k RMSNorm, full or partial
rotary) and the SwiGLU MLP (fused gate/up). Checkpoints store q/k/v and gate/up either apart
(Llama) or already fused (Phi-3); both load into the same fused weights. The sparse expert MLP
is quire.model.moe."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import quire.kernels as kernels
from quire.model.attention import AttentionMetadata, KVCache, PagedAttention
from quire.model.model_config import ModelConfig
from quire.model.quantized_linear import AnyLinear, Weight, concat_rows, make_linear
from quire.model.rope import RotaryEmbedding


class CheckpointTensors:
    """Hands out checkpoint tensors once each, then names anything missing or left over.
    Linear weights and the embedding table may be quantized (`weight`); other tensors not."""

    def __init__(self, state: dict[str, Weight]) -> None:
        self.state = state
        self.used: set[str] = set()
        self.missing: list[str] = []

    def __call__(self, name: str) -> torch.Tensor:
        tensor = self.weight(name)
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"checkpoint tensor {name!r} is quantized; Quire needs it in floats")
        return tensor

    def weight(self, name: str) -> Weight:
        """A linear weight or embedding table: a float tensor or quantized blocks."""
        self.used.add(name)
        if name not in self.state:
            self.missing.append(name)
            return torch.empty(0)
        return self.state[name]

    def optional(self, name: str, present: bool) -> torch.Tensor | None:
        """The tensor `name` where the config says it exists (a bias), else None."""
        return self(name) if present else None

    def concat(self, names: list[str], present: bool = True) -> torch.Tensor | None:
        """Tensors concatenated along dim 0 (q/k/v into qkv, gate/up into gate_up)."""
        return torch.cat([self(n) for n in names]) if present else None

    def concat_weights(self, names: list[str]) -> Weight | list[Weight]:
        """Linear weights stacked along out_features (q/k/v into qkv, gate/up into gate_up);
        quantized_linear.concat_rows says when they stay apart."""
        return concat_rows([self.weight(n) for n in names])

    def discard(self, name: str) -> None:
        self.used.add(name)

    def finish(self) -> None:
        if self.missing:
            shown = ", ".join(self.missing[:5])
            raise ValueError(f"checkpoint is missing {len(self.missing)} tensors: {shown}")
        extra = [n for n in self.state if n not in self.used and not n.endswith("inv_freq")]
        if extra:
            raise ValueError(f"checkpoint has {len(extra)} unexpected tensors: {extra[:5]}")


class Attention:
    """qkv projection -> (per-head q/k RMSNorm) -> rotary -> paged attention -> o projection."""

    def __init__(
        self,
        config: ModelConfig,
        qkv: AnyLinear,  # [(heads + 2 * kv_heads) * D, hidden]
        o: AnyLinear,  # [hidden, heads * D]
        rotary: RotaryEmbedding,
        paged: PagedAttention,
        qk_norm: tuple[torch.Tensor, torch.Tensor] | None = None,  # q, k weights: [D] each
    ) -> None:
        self.qkv = qkv
        self.o = o
        self.rotary = rotary
        self.paged = paged
        self.qk_norm = qk_norm
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.eps = config.rms_norm_eps
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim

    @property
    def num_params(self) -> int:
        """The projections' weights (qkv and o)."""
        return self.qkv.num_params + self.o.num_params

    @classmethod
    def load(
        cls,
        take: CheckpointTensors,
        prefix: str,  # e.g. "model.layers.3.self_attn."
        config: ModelConfig,
        backend: str,
        rotary: RotaryEmbedding,
        paged: PagedAttention,
        qk_norm: bool = False,
        fused: bool = False,
    ) -> Attention:
        """q_proj/k_proj/v_proj/o_proj (+ q_norm/k_norm) under `prefix`, q/k/v fused; with
        `fused`, the checkpoint's own qkv_proj."""
        names = [f"{prefix}qkv_proj"] if fused else [f"{prefix}{n}_proj" for n in "qkv"]
        qkv_weight = take.concat_weights([n + ".weight" for n in names])
        qkv = make_linear(
            qkv_weight, take.concat([n + ".bias" for n in names], config.qkv_bias), backend
        )
        o = make_linear(
            take.weight(prefix + "o_proj.weight"),
            take.optional(prefix + "o_proj.bias", config.o_bias),
            backend,
        )
        norms = (
            (take(prefix + "q_norm.weight"), take(prefix + "k_norm.weight")) if qk_norm else None
        )
        return cls(config, qkv, o, rotary, paged, norms)

    def __call__(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        positions: torch.Tensor,  # [num_tokens] int64
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        q, k, v = self.qkv(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # views into qkv: [num_tokens, heads, head_dim], rotated in place
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm is not None:  # RMSNorm over each head's vector, before rotary
            q_weight, k_weight = self.qk_norm
            q = kernels.rms_norm(q.reshape(-1, self.head_dim), q_weight, self.eps).view_as(q)
            k = kernels.rms_norm(k.reshape(-1, self.head_dim), k_weight, self.eps).view_as(k)
        rotary_dim = self.rotary.rotary_dim  # partial rotary: only each head's first dims
        q_rot, k_rot = (
            (q, k) if rotary_dim == self.head_dim else (q[..., :rotary_dim], k[..., :rotary_dim])
        )
        kernels.rotary_embedding_(positions, q_rot, k_rot, self.rotary.cos, self.rotary.sin)
        attn = self.paged(q, k, v, kv_cache, meta)
        return self.o(attn.reshape(-1, self.q_size))


class GatedMLP:
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up fused into one matmul."""

    def __init__(self, gate_up: AnyLinear, down: AnyLinear) -> None:
        self.gate_up = gate_up  # [2 * intermediate, hidden]
        self.down = down  # [hidden, intermediate]

    @property
    def num_active_params(self) -> int:
        """Weights one token is multiplied by."""
        return self.gate_up.num_params + self.down.num_params

    @classmethod
    def load(
        cls,
        take: CheckpointTensors,
        prefix: str,  # e.g. "model.layers.3.mlp."
        backend: str,
        bias: bool = False,
        fused: bool = False,
    ) -> GatedMLP:
        """gate_proj/up_proj/down_proj under `prefix`; with `fused`, the checkpoint's own
        gate_up_proj (gate rows first)."""
        names = [prefix + "gate_up_proj"] if fused else [prefix + "gate_proj", prefix + "up_proj"]
        gate_up_weight = take.concat_weights([n + ".weight" for n in names])
        gate_up = make_linear(
            gate_up_weight, take.concat([n + ".bias" for n in names], bias), backend
        )
        down_bias = take.optional(prefix + "down_proj.bias", bias)
        down = make_linear(take.weight(prefix + "down_proj.weight"), down_bias, backend)
        return cls(gate_up, down)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)
