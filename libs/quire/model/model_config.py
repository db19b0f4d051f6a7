"""ModelConfig: what the forward pass needs to know, read from a Hugging Face config."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quire.model.architectures import SUPPORTED_ARCHITECTURES, unsupported_message
from quire.model.attention_layout import AttentionLayout, attention_layout_from_hf

__all__ = ["SUPPORTED_ARCHITECTURES", "ModelConfig", "MoeConfig", "RopeConfig"]


ROPE_TYPES = ("default", "linear", "llama3", "longrope")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters (rope_type default | linear | llama3 | longrope)."""

    rope_type: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # longrope (Phi-3): per-pair divisors of the frequencies for contexts up to
    # original_max_position_embeddings (short) and beyond (long), and the factor cos and sin
    # are scaled by (transformers' attention_scaling).
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0
    partial_rotary_factor: float = 1.0  # share of each head's dims that rotate (the first ones)

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"rope_type {self.rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
            )
        if self.theta <= 0 or self.factor <= 0 or self.attention_factor <= 0:
            raise ValueError("rope theta, factor and attention_factor must be positive")
        if not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(
                f"partial_rotary_factor must lie in (0, 1], got {self.partial_rotary_factor}"
            )
        if self.rope_type == "longrope" and (
            not self.short_factor or len(self.short_factor) != len(self.long_factor)
        ):
            raise ValueError("longrope needs short_factor and long_factor of one length")

    def rotary_dim(self, head_dim: int) -> int:
        """The leading dims of each head that rotate (all of them unless partial)."""
        return int(head_dim * self.partial_rotary_factor)


@dataclass(frozen=True)
class MoeConfig:
    """Sparse mixture-of-experts MLPs: which layers have them and how tokens are routed."""

    num_experts: int  # routed experts per sparse layer
    top_k: int  # experts each token runs through
    intermediate_size: int  # each expert's SwiGLU width
    normalize_top_k: bool  # renormalize the top-k router probabilities to sum to 1
    sparse_layers: tuple[int, ...]  # layer indices whose MLP is sparse; the rest are dense

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.top_k}) must lie in [1, num_experts "
                f"({self.num_experts})]"
            )
        if self.intermediate_size < 1:
            raise ValueError("the experts' intermediate size must be >= 1")


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-family decoder, independent of where it came from."""

    architecture: str  # one of SUPPORTED_ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_model_len: int  # longest sequence (prompt + output) the model may see
    rms_norm_eps: float = 1e-5
    rope: RopeConfig = field(default_factory=RopeConfig)
    qkv_bias: bool = False  # Qwen2 and Llama attention_bias=True
    o_bias: bool = False  # Llama attention_bias=True only
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"  # dtype the checkpoint was saved in
    moe: MoeConfig | None = None  # sparse expert MLPs (Qwen3-MoE, Mixtral); None: all dense
    # sliding layers and their window, attention soft cap, query scaling (Mistral, Gemma)
    attention: AttentionLayout = field(default_factory=AttentionLayout)
    local_rope: RopeConfig | None = None  # the sliding layers' rotary, where it differs (Gemma 3)
    final_logit_soft_cap: float | None = None  # logits -> cap * tanh(logit / cap) (Gemma)
    hidden_activation: str = "silu"  # the gated MLP's activation (Gemma: gelu_pytorch_tanh)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(unsupported_message(self.architecture))
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"model config field {name} must be >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.moe and not all(0 <= i < self.num_layers for i in self.moe.sparse_layers):
            raise ValueError(f"sparse layers {self.moe.sparse_layers} outside the model's layers")
        if not all(0 <= i < self.num_layers for i in self.attention.sliding_layers):
            raise ValueError(
                f"sliding layers {self.attention.sliding_layers} outside the model's layers"
            )

    @property
    def scale(self) -> float:
        """The softmax scale: query_pre_attn_scalar**-0.5 where the config names one (Gemma),
        else head_dim**-0.5."""
        return 1.0 / math.sqrt(self.attention.query_pre_attn_scalar or self.head_dim)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read `path/config.json` through transformers' config classes."""
        from transformers import AutoConfig

        path = Path(path)
        if not path.is_dir():
            raise ValueError(f"model path {str(path)!r} is not a directory")
        if not (path / "config.json").is_file():
            raise ValueError(f"model path {str(path)!r} has no config.json")
        hf = AutoConfig.from_pretrained(path, local_files_only=True)
        return cls.from_hf(hf)

    @classmethod
    def from_hf(cls, hf: Any) -> ModelConfig:
        archs = list(getattr(hf, "architectures", None) or [])
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(unsupported_message(", ".join(archs) or hf.model_type))
        max_len = int(hf.max_position_embeddings)
        eos = hf.eos_token_id
        eos_ids = tuple(eos) if isinstance(eos, list | tuple) else (() if eos is None else (eos,))
        heads = int(hf.num_attention_heads)
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
        attention_bias = bool(getattr(hf, "attention_bias", False))
        return cls(
            architecture=arch,
            vocab_size=int(hf.vocab_size),
            hidden_size=int(hf.hidden_size),
            intermediate_size=int(hf.intermediate_size),
            num_layers=int(hf.num_hidden_layers),
            num_heads=heads,
            num_kv_heads=int(getattr(hf, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            max_model_len=max_len,
            rms_norm_eps=float(hf.rms_norm_eps),
            rope=_rope_from_hf(hf),
            qkv_bias=arch == "Qwen2ForCausalLM" or attention_bias,
            o_bias=arch != "Qwen2ForCausalLM" and attention_bias,
            mlp_bias=bool(getattr(hf, "mlp_bias", False)),
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            bos_token_id=hf.bos_token_id,
            eos_token_ids=eos_ids,
            torch_dtype=str(getattr(hf, "dtype", None) or "float32").removeprefix("torch."),
            moe=_moe_from_hf(hf, arch),
            attention=attention_layout_from_hf(hf, attention_soft_cap=arch == "Gemma2ForCausalLM"),
            local_rope=_rope_from_hf(hf, "sliding_attention") if _has_layer_ropes(hf) else None,
            final_logit_soft_cap=getattr(hf, "final_logit_softcapping", None),
            hidden_activation=str(
                getattr(hf, "hidden_activation", None) or getattr(hf, "hidden_act", "silu")
            ),
        )


def _moe_from_hf(hf: Any, arch: str) -> MoeConfig | None:
    num_layers = int(hf.num_hidden_layers)
    if arch == "MixtralForCausalLM":  # every layer sparse; top-k always renormalized
        return MoeConfig(
            num_experts=int(hf.num_local_experts),
            top_k=int(hf.num_experts_per_tok),
            intermediate_size=int(hf.intermediate_size),
            normalize_top_k=True,
            sparse_layers=tuple(range(num_layers)),
        )
    if arch == "Qwen3MoeForCausalLM":  # sparse every decoder_sparse_step-th layer
        num_experts, step = int(hf.num_experts), int(hf.decoder_sparse_step)
        dense = set(getattr(hf, "mlp_only_layers", None) or ())
        sparse = tuple(
            i for i in range(num_layers) if i not in dense and num_experts and (i + 1) % step == 0
        )
        if not sparse:
            return None
        return MoeConfig(
            num_experts=num_experts,
            top_k=int(hf.num_experts_per_tok),
            intermediate_size=int(hf.moe_intermediate_size),
            normalize_top_k=bool(hf.norm_topk_prob),
            sparse_layers=sparse,
        )
    return None


def _has_layer_ropes(hf: Any) -> bool:
    """Whether rope_parameters is keyed by layer type (Gemma 3: a base per type)."""
    return isinstance(getattr(hf, "rope_parameters", None), dict) and all(
        isinstance(value, dict) for value in hf.rope_parameters.values()
    )


def _rope_from_hf(hf: Any, layer_type: str = "full_attention") -> RopeConfig:
    params = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    if _has_layer_ropes(hf):
        params = dict(params[layer_type])
    theta = params.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    rope_type = "longrope" if rope_type == "su" else rope_type  # Phi-3's first name for it
    original_max = int(
        params.get(
            "original_max_position_embeddings",
            getattr(hf, "original_max_position_embeddings", hf.max_position_embeddings),
        )
    )
    partial = params.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", None))
    return RopeConfig(
        rope_type=rope_type,
        theta=float(theta),
        factor=float(params.get("factor", 1.0) or 1.0),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original_max,
        short_factor=tuple(float(f) for f in params.get("short_factor") or ()),
        long_factor=tuple(float(f) for f in params.get("long_factor") or ()),
        attention_factor=_longrope_attention_factor(hf, params, original_max)
        if rope_type == "longrope"
        else 1.0,
        partial_rotary_factor=float(partial or 1.0),
    )


def _longrope_attention_factor(hf: Any, params: dict[str, Any], original_max: int) -> float:
    """transformers' default when the config names none: sqrt(1 + ln(factor) / ln(original
    max)), factor being max_position_embeddings / original_max_position_embeddings unless
    given."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor = params.get("factor") or hf.max_position_embeddings / original_max
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_max))
