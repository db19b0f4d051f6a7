"""ModelConfig: what the forward pass needs to know, read from a Hugging Face config."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quire.kernels.signatures import ClampedSwiGLU
from quire.model.architectures import SUPPORTED_ARCHITECTURES, unsupported_message
from quire.model.attention_layout import AttentionLayout, attention_layout_from_hf
from quire.model.yarn import yarn_attention_factor, yarn_mscale

__all__ = ["SUPPORTED_ARCHITECTURES", "MlaConfig", "ModelConfig", "MoeConfig", "RopeConfig"]


ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters (rope_type default | linear | llama3 | longrope | yarn)."""

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
    # yarn (DeepSeek-V2): pairs turning more than beta_fast times over the original context
    # keep their frequency, fewer than beta_slow are divided by factor, a linear ramp between
    # (its ends rounded outward when truncate); attention_factor scales cos and sin.
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True

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
    # DeepSeek-V2: a SwiGLU every token runs through beside its routed experts, as wide as
    # this many experts (0: none), and the factor the routed experts' weights are scaled by.
    num_shared_experts: int = 0
    routed_scaling_factor: float = 1.0
    # gpt-oss: the router and every expert projection carry biases, and the experts' activation
    # is its clamped SwiGLU
    biases: bool = False
    clamp: ClampedSwiGLU | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.top_k}) must lie in [1, num_experts "
                f"({self.num_experts})]"
            )
        if self.intermediate_size < 1:
            raise ValueError("the experts' intermediate size must be >= 1")
        if self.num_shared_experts < 0:
            raise ValueError("n_shared_experts must be >= 0")


@dataclass(frozen=True)
class MlaConfig:
    """Multi-head latent attention (DeepSeek-V2): each token caches one compressed latent
    (kv_lora_rank wide) and one rotary key shared by all heads; every head's keys and values
    are linear maps of that latent."""

    kv_lora_rank: int  # the latent's width
    qk_nope_head_dim: int  # each head's query and key dims without rotary
    qk_rope_head_dim: int  # each head's rotary dims (the rotary key is one for all heads)
    v_head_dim: int  # each head's value dims
    q_lora_rank: int | None  # queries through a low-rank q_a -> RMSNorm -> q_b; None: q_proj
    # (qk_nope + qk_rope)^-0.5, times YaRN's mscale(factor, mscale_all_dim)^2 where the rope
    # is scaled and the config names mscale_all_dim (transformers' DeepSeek-V2 scaling)
    softmax_scale: float

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"model config field {name} must be >= 1")
        if self.qk_rope_head_dim % 2:
            raise ValueError("qk_rope_head_dim must be even (dims rotate in pairs)")

    @property
    def latent_dim(self) -> int:
        """What one layer caches per token: the latent, then the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


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
    mla: MlaConfig | None = None  # multi-head latent attention (DeepSeek-V2); None: K and V heads

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
        quantization = getattr(hf, "quantization_config", None)
        if quantization:
            from quire.model.quantization_methods import quantization_problem

            settings = quantization if isinstance(quantization, dict) else quantization.to_dict()
            problem = quantization_problem(settings)
            if problem is not None:
                raise ValueError(f"the checkpoint's quantization {problem}")
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
            mla=_mla_from_hf(hf) if arch == "DeepseekV2ForCausalLM" else None,
        )


def _moe_from_hf(hf: Any, arch: str) -> MoeConfig | None:
    num_layers = int(hf.num_hidden_layers)
    if arch in ("MixtralForCausalLM", "GptOssForCausalLM"):
        # every layer sparse; top-k always renormalized (gpt-oss's softmax over the top-k
        # logits is the same); gpt-oss's experts carry biases and its clamped SwiGLU
        gpt_oss = arch == "GptOssForCausalLM"
        return MoeConfig(
            num_experts=int(hf.num_local_experts),
            top_k=int(hf.num_experts_per_tok),
            intermediate_size=int(hf.intermediate_size),
            normalize_top_k=True,
            sparse_layers=tuple(range(num_layers)),
            biases=gpt_oss,
            clamp=ClampedSwiGLU(
                alpha=float(getattr(hf, "swiglu_alpha", 1.702)),
                limit=float(getattr(hf, "swiglu_limit", 7.0)),
            )
            if gpt_oss
            else None,
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
    if arch == "DeepseekV2ForCausalLM":  # sparse from first_k_dense_replace on
        # transformers' model reads neither moe_layer_freq nor norm_topk_prob: the routed
        # weights are the top-k softmax probabilities times routed_scaling_factor.
        if (getattr(hf, "topk_method", None) or "greedy") != "greedy":
            raise ValueError(
                f"DeepSeek-V2 topk_method {hf.topk_method!r}: only greedy is supported"
            )
        first_sparse = int(getattr(hf, "first_k_dense_replace", 0) or 0)
        return MoeConfig(
            num_experts=int(hf.n_routed_experts),
            top_k=int(hf.num_experts_per_tok),
            intermediate_size=int(hf.moe_intermediate_size),
            normalize_top_k=False,
            sparse_layers=tuple(range(first_sparse, num_layers)),
            num_shared_experts=int(getattr(hf, "n_shared_experts", 0) or 0),
            routed_scaling_factor=float(hf.routed_scaling_factor),
        )
    return None


def _mla_from_hf(hf: Any) -> MlaConfig:
    nope, rope = int(hf.qk_nope_head_dim), int(hf.qk_rope_head_dim)
    scale = (nope + rope) ** -0.5
    params = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    if params.get("rope_type", params.get("type", "default")) not in (None, "default"):
        mscale_all_dim = params.get("mscale_all_dim")
        if mscale_all_dim:
            scale *= yarn_mscale(float(params["factor"]), float(mscale_all_dim)) ** 2
    q_lora_rank = getattr(hf, "q_lora_rank", None)
    return MlaConfig(
        kv_lora_rank=int(hf.kv_lora_rank),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=int(hf.v_head_dim),
        q_lora_rank=None if q_lora_rank is None else int(q_lora_rank),
        softmax_scale=scale,
    )


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
    factor = float(params.get("factor", 1.0) or 1.0)
    if rope_type == "yarn":
        factor = float(params.get("factor") or hf.max_position_embeddings / original_max)
        attention_factor = params.get("attention_factor") or yarn_attention_factor(
            factor, params.get("mscale"), params.get("mscale_all_dim")
        )
    elif rope_type == "longrope":
        attention_factor = _longrope_attention_factor(hf, params, original_max)
    else:
        attention_factor = 1.0
    return RopeConfig(
        rope_type=rope_type,
        theta=float(theta),
        factor=factor,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original_max,
        short_factor=tuple(float(f) for f in params.get("short_factor") or ()),
        long_factor=tuple(float(f) for f in params.get("long_factor") or ()),
        attention_factor=float(attention_factor),
        partial_rotary_factor=float(partial or 1.0),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        truncate=bool(params.get("truncate", True)),
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
