"""Generate deterministic random-weight checkpoints (plus tokenizer) in Hugging Face layout.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on ``corpus.txt`` beside this
file, and the weights are drawn from per-tensor seeded CPU generators, so every run writes the
same bytes. Used by tests (engine output is compared token-for-token with transformers) and by
benchmarks.

    python -m quire_tools.make_model --preset tiny --out models/quire-tiny
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from quire_tools.bpe_tokenizer import (  # noqa: F401  (re-exported: the ids tests use)
    BOS_ID,
    CORPUS_PATH,
    EOS_ID,
    IM_END_ID,
    IM_START_ID,
    PAD_ID,
    VOCAB_SIZE,
    tokenizer_json,
    tokenizer_style,
    write_tokenizer,
)
from quire_tools.checkpoint_dir import write_json, written_whole

logger = logging.getLogger(__name__)


def _rope(theta: float) -> dict[str, Any]:
    return {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}


_COMMON: dict[str, Any] = {
    "hidden_act": "silu",
    "attention_dropout": 0.0,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
# Gemma 2 and 3: gelu MLPs, tied embeddings, (1 + weight) norms.
_GEMMA: dict[str, Any] = {
    **_COMMON,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "attention_bias": False,
}
# Gemma 3 (text): no soft caps, a rope base per layer type.
_GEMMA3: dict[str, Any] = {
    **_GEMMA,
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
}
_LLAMA: dict[str, Any] = {
    **_COMMON,
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "mlp_bias": False,
}
# tiny-phi3-longrope's original_max_position_embeddings: contexts up to it rotate with the short
# factors, longer ones with the long factors.
LONGROPE_ORIGINAL_MAX = 64
_TINY_SHAPE: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}

# HF config.json fields per preset; vocab size and special-token ids come from the tokenizer.
# transformers 5 writes rope as `rope_parameters`; `tiny-mqa` deliberately uses the legacy
# `rope_theta` + `rope_scaling` keys (as Llama-3 hub checkpoints do) so loaders meet both.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {**_LLAMA, **_TINY_SHAPE, "head_dim": 32, **_rope(10000.0)},
    "bench": {
        **_LLAMA,
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 14,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "head_dim": 64,
        **_rope(10000.0),
    },
    # About a billion parameters in TinyLlama-1.1B's shape (GQA 8:1): how each system's cost grows
    # with the model beside the 135M default (make bench-serving on its GGUFs, make gguf-1b).
    "bench-1b": {
        **_LLAMA,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 64,
        **_rope(10000.0),
    },
    # Mistral-shaped with a short window on every layer: what freeing blocks outside the window
    # gains under a KV budget (make bench-engine ... --model a checkpoint of it).
    "bench-mistral-window": {
        **_COMMON,
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "sliding_window": 64,
        **_rope(10000.0),
    },
    # Gemma 3-shaped: five sliding layers (a 64-token window) to one global layer, what freeing
    # the sliding layers' blocks gains a hybrid model under a KV budget.
    "bench-gemma3-window": {
        **_GEMMA3,
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "sliding_window": 64,
        "layer_types": [*["sliding_attention"] * 5, "full_attention"],
        "query_pre_attn_scalar": 64,
    },
    "tiny-mqa": {
        **_LLAMA,
        **_TINY_SHAPE,
        "num_key_value_heads": 1,
        "head_dim": 64,  # q_proj is 4 * 64 = 256 wide, twice hidden_size
        "max_position_embeddings": 4096,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 512,
        },
    },
    "tiny-qwen2": {
        **_COMMON,
        **_TINY_SHAPE,
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",  # q/k/v always carry biases; no head_dim key
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 4,
        **_rope(1000000.0),
    },
    "tiny-qwen3": {
        **_COMMON,
        **_TINY_SHAPE,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",  # q_norm/k_norm per head; head_dim 48 != hidden / heads
        "head_dim": 48,
        "attention_bias": False,
        "rms_norm_eps": 1e-6,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 4,
        **_rope(1000000.0),
    },
    "tiny-qwen3-moe": {
        **_COMMON,
        **_TINY_SHAPE,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_hidden_layers": 3,
        "head_dim": 64,
        "attention_bias": False,
        "rms_norm_eps": 1e-6,
        "use_sliding_window": False,
        "sliding_window": None,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 96,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [1],  # layer 1 keeps a dense MLP (intermediate_size wide)
        "router_aux_loss_coef": 0.0,
        "output_router_logits": False,
        **_rope(1000000.0),
    },
    "tiny-mixtral": {
        **_COMMON,
        **_TINY_SHAPE,
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_hidden_layers": 2,
        "intermediate_size": 192,  # each expert's
        "head_dim": 32,
        "sliding_window": None,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "router_jitter_noise": 0.0,
        "router_aux_loss_coef": 0.0,
        "output_router_logits": False,
        **_rope(1000000.0),
    },
    "tiny-phi3": {
        **_COMMON,
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",  # qkv_proj and gate_up_proj fused in the checkpoint
        "hidden_size": 256,
        "intermediate_size": 384,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,  # head_dim 64
        "num_key_value_heads": 2,
        "original_max_position_embeddings": 2048,
        "sliding_window": None,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        **_rope(10000.0),
    },
    # LongRoPE over the first 3/4 of each 128-wide head: short factors up to 64 positions,
    # long ones past them (Phi-3-mini-128k and Phi-4-mini's shape of rope, scaled down).
    "tiny-phi3-longrope": {
        **_COMMON,
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "hidden_size": 256,
        "intermediate_size": 320,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,  # head_dim 128, one kv head
        "num_key_value_heads": 1,
        "original_max_position_embeddings": LONGROPE_ORIGINAL_MAX,
        "sliding_window": None,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "rope_parameters": {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.75,
            "short_factor": [round(1.0 + 0.02 * i, 2) for i in range(48)],
            "long_factor": [1.0 + 0.75 * i for i in range(48)],
        },
    },
    # DeepSeek-V2-Lite's shape, scaled down: MLA with no query compression (q_proj), a dense
    # first layer, then 8 routed experts (top-2) beside 2 shared ones, and YaRN rope.
    "tiny-deepseek-v2": {
        **_COMMON,
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_size": 128,
        "intermediate_size": 256,  # the dense layer's
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": None,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 48,  # q . k over 48 + 16 = 64 dims per head
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 2,
        "moe_intermediate_size": 48,
        "first_k_dense_replace": 1,
        "routed_scaling_factor": 1.0,
        "topk_method": "greedy",
        "norm_topk_prob": False,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 512,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
        },
    },
    # DeepSeek-V2's own kind of shape: queries through a low rank (q_lora_rank), q . k over
    # 96 + 32 = 128 dims per head, every layer sparse with top-1 of 4 experts scaled by 2.5
    # beside one shared expert, plain rope.
    "tiny-deepseek-v2-q-lora": {
        **_COMMON,
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "q_lora_rank": 64,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 96,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
        "n_routed_experts": 4,
        "num_experts_per_tok": 1,
        "n_shared_experts": 1,
        "moe_intermediate_size": 64,
        "first_k_dense_replace": 0,
        "routed_scaling_factor": 2.5,
        "topk_method": "greedy",
        "norm_topk_prob": False,
        **_rope(10000.0),
    },
    "tiny-mistral": {
        **_COMMON,
        **_TINY_SHAPE,
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "head_dim": 32,
        "sliding_window": None,
        **_rope(10000.0),
    },
    # Mistral-7B-v0.1's sliding window over every layer, shorter than the test prompts.
    "tiny-mistral-window": {
        **_COMMON,
        **_TINY_SHAPE,
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "head_dim": 32,
        "sliding_window": 24,
        **_rope(10000.0),
    },
    # Gemma 2: sliding and global layers alternating (window 16), attention and final logit
    # soft caps low enough to change the tokens, query_pre_attn_scalar unlike head_dim.
    "tiny-gemma2": {
        **_GEMMA,
        **_TINY_SHAPE,
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "head_dim": 64,  # q_proj 4 * 64 = 256 wide, twice hidden_size
        "intermediate_size": 256,
        "sliding_window": 16,
        "query_pre_attn_scalar": 48,
        "attn_logit_softcapping": 3.0,
        "final_logit_softcapping": 15.0,
        **_rope(10000.0),
    },
    # Gemma 3 (text): per-head q/k norms, head_dim 128 with one kv head, a global layer among
    # sliding ones (window 24), rope bases 1e6 (global) and 1e4 (sliding).
    "tiny-gemma3": {
        **_GEMMA3,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "sliding_window": 24,
        "layer_types": [
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
        ],
        "query_pre_attn_scalar": 128,
    },
    # Gemma 3 with 2 global and 5 sliding layers: KV groups of 2 layers, the last sliding group
    # half used (a padded slot), head_dim 64, GQA 2.
    "tiny-gemma3-uneven": {
        **_GEMMA3,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 7,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "sliding_window": 16,
        "layer_types": [
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
        ],
        "query_pre_attn_scalar": 64,
    },
    # gpt-oss: biased q/k/v/o, a sink logit per head, sliding (window 16) and global layers
    # alternating, YaRN rotary (not truncated), 4 experts top-2 with biases and a clamped
    # SwiGLU whose limit (1.0, not the released 7.0) the random activations reach.
    "tiny-gpt-oss": {
        **_COMMON,
        **_TINY_SHAPE,
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "head_dim": 64,
        "intermediate_size": 96,  # each expert's
        "attention_bias": True,
        "sliding_window": 16,
        "layer_types": [
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
        ],
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "swiglu_alpha": 1.702,
        "swiglu_limit": 1.0,
        "router_aux_loss_coef": 0.0,
        "output_router_logits": False,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 8.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 256,
        },
    },
    # gpt-oss, other shapes: head_dim 128 with one kv head (MQA), 8 experts top-1, window 24,
    # two global layers after a sliding one, the released clamp (7.0), truncated YaRN.
    "tiny-gpt-oss-mqa": {
        **_COMMON,
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 128,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "attention_bias": True,
        "sliding_window": 24,
        "layer_types": ["sliding_attention", "full_attention", "full_attention"],
        "num_local_experts": 8,
        "num_experts_per_tok": 1,
        "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0,
        "router_aux_loss_coef": 0.0,
        "output_router_logits": False,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": True,
            "original_max_position_embeddings": 64,
        },
    },
}


@dataclass(frozen=True)
class InitScales:
    """How random weights are drawn: decisive greedy logits, sane activations at 300+ tokens."""

    embed_std: float = 1.0
    """Std of untied token embeddings."""
    tied_embed_std: float = 0.05
    """Std of tied embeddings: kept small so the current token's own embedding in the residual
    stream does not win the next-token logits (greedy decoding would repeat one token)."""
    logit_std: float = 4.0
    """Target std of output logits; top-2 gaps scale with it (gap < 1e-3 is ~0.1% at 4.0)."""
    qk_gain: float = 1.5
    """Gain on q/k projections: attention score std ~= qk_gain**2, so attention is not flat."""
    norm_jitter: float = 0.1
    """RMSNorm weights are 1 + N(0, norm_jitter), so a loader that drops them is caught."""
    bias_std: float = 0.1
    """Std of q/k/v biases (Qwen2): dropping any of them changes greedy output within ~10
    tokens, while larger q biases make attention fixate and greedy decoding loop."""

    def __post_init__(self) -> None:
        for name in ("embed_std", "tied_embed_std", "logit_std", "qk_gain"):
            if getattr(self, name) <= 0:
                raise ValueError(f"InitScales.{name} must be positive")


def build_config(preset: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the full config.json dict for `preset`, with `overrides` applied on top."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    config = copy.deepcopy(PRESETS[preset]) | copy.deepcopy(overrides or {})
    config |= {
        "vocab_size": VOCAB_SIZE,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "dtype": "float32",
        "use_cache": True,
        "initializer_range": 0.02,
    }
    if (config.get("attention_bias") and config["model_type"] != "gpt_oss") or config.get(
        "mlp_bias"
    ):
        raise ValueError("attention_bias/mlp_bias are not generated for llama-style presets")
    hidden, num_heads = config["hidden_size"], config["num_attention_heads"]
    if hidden % num_heads or num_heads % config["num_key_value_heads"]:
        raise ValueError("hidden_size % num_attention_heads and GQA grouping must divide evenly")
    return config


@dataclass(frozen=True)
class TensorSpec:
    """One stored tensor: its checkpoint name, shape and the normal it is drawn from."""

    name: str
    shape: tuple[int, ...]
    mean: float
    std: float


def parameter_specs(config: dict[str, Any], scales: InitScales) -> list[TensorSpec]:
    """Return the spec of every stored tensor, in checkpoint order."""
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    num_heads, num_kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // num_heads
    tied = config["tie_word_embeddings"]
    qkv_bias = config["model_type"] == "qwen2"
    attention_bias = config["model_type"] == "gpt_oss"  # q/k/v/o biases and a sink per head
    qk_norm = config["model_type"] in ("qwen3", "qwen3_moe", "gemma3_text")
    # Gemma's norms scale by 1 + weight: its stored weights are the others' minus 1
    norm_offset = 1.0 if config["model_type"] in ("gemma2", "gemma3_text") else 0.0
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    proj_std = 1.0 / math.sqrt(hidden)
    qk_std = scales.qk_gain * proj_std
    # logits = lm_head @ (final_norm * x_hat) with rms(x_hat) = 1, so their std over the vocab
    # is lm_head_std * final_norm * sqrt(hidden). Untied: the head carries the scale. Tied: the
    # head is the (small) embedding, so the final norm weight carries it.
    if tied:
        embed_std, lm_head_std = scales.tied_embed_std, scales.tied_embed_std
    else:
        embed_std, lm_head_std = scales.embed_std, scales.logit_std / math.sqrt(hidden)
    final_norm_mean = scales.logit_std / (lm_head_std * math.sqrt(hidden))

    def norm(name: str, mean: float = 1.0, size: int = hidden) -> TensorSpec:
        return TensorSpec(name, (size,), mean - norm_offset, mean * scales.norm_jitter)

    def linear(name: str, out_features: int, in_features: int, std: float) -> list[TensorSpec]:
        specs = [TensorSpec(f"{name}.weight", (out_features, in_features), 0.0, std)]
        biased = (
            ("q_proj", "k_proj", "v_proj", "o_proj")
            if attention_bias
            else ("q_proj", "k_proj", "v_proj")
        )
        if (qkv_bias or attention_bias) and name.endswith(biased):
            specs.append(TensorSpec(f"{name}.bias", (out_features,), 0.0, scales.bias_std))
        return specs

    specs = [TensorSpec("model.embed_tokens.weight", (vocab, hidden), 0.0, embed_std)]
    for i in range(config["num_hidden_layers"]):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        specs.append(norm(f"model.layers.{i}.input_layernorm.weight"))
        if config["model_type"] == "deepseek_v2":
            specs += _mla_specs(config, attn, scales)
        else:
            specs += linear(f"{attn}.q_proj", q_size, hidden, qk_std)
            specs += linear(f"{attn}.k_proj", kv_size, hidden, qk_std)
            specs += linear(f"{attn}.v_proj", kv_size, hidden, proj_std)
            specs += linear(f"{attn}.o_proj", hidden, q_size, q_size**-0.5)
        if attention_bias:  # sinks around the scores' own scale (qk_gain**2)
            specs.append(TensorSpec(f"{attn}.sinks", (num_heads,), 0.0, scales.qk_gain))
        if qk_norm:  # per-head norms set the attention scale that qk_gain sets elsewhere
            specs.append(norm(f"{attn}.q_norm.weight", scales.qk_gain, head_dim))
            specs.append(norm(f"{attn}.k_norm.weight", scales.qk_gain, head_dim))
        specs.append(norm(f"model.layers.{i}.post_attention_layernorm.weight"))
        if norm_offset:  # Gemma norms the MLP's input and its output too
            specs.append(norm(f"model.layers.{i}.pre_feedforward_layernorm.weight"))
            specs.append(norm(f"model.layers.{i}.post_feedforward_layernorm.weight"))
        if config["model_type"] == "gpt_oss":
            specs += _gpt_oss_expert_specs(config, i, proj_std, scales.bias_std)
            continue
        if i in sparse_layers(config):
            specs += _expert_specs(config, i, proj_std)
            continue
        specs += linear(f"{mlp}.gate_proj", inter, hidden, proj_std)
        specs += linear(f"{mlp}.up_proj", inter, hidden, proj_std)
        specs += linear(f"{mlp}.down_proj", hidden, inter, inter**-0.5)
    specs.append(norm("model.norm.weight", final_norm_mean))
    if not tied:
        specs.append(TensorSpec("lm_head.weight", (vocab, hidden), 0.0, lm_head_std))
    return specs


def sparse_layers(config: dict[str, Any]) -> set[int]:
    """The layers whose MLP is a sparse mixture of experts (as transformers builds them)."""
    num_layers = config["num_hidden_layers"]
    if config["model_type"] in ("mixtral", "gpt_oss"):
        return set(range(num_layers))
    if config["model_type"] == "qwen3_moe":
        dense, step = set(config["mlp_only_layers"]), config["decoder_sparse_step"]
        return {i for i in range(num_layers) if i not in dense and (i + 1) % step == 0}
    if config["model_type"] == "deepseek_v2":
        return set(range(config["first_k_dense_replace"], num_layers))
    return set()


def _mla_specs(config: dict[str, Any], attn: str, scales: InitScales) -> list[TensorSpec]:
    """DeepSeek-V2's attention: q (direct or through q_lora_rank), the latent and rotary key
    (kv_a_proj_with_mqa), the latent's norm, its up-projection to keys and values (kv_b_proj)."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    nope, rope, v = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    lora, q_lora = config["kv_lora_rank"], config["q_lora_rank"]
    q_rows = heads * (nope + rope)

    def spec(name: str, shape: tuple[int, ...], std: float, mean: float = 0.0) -> TensorSpec:
        return TensorSpec(f"{attn}.{name}", shape, mean, std)

    def norm(name: str, size: int) -> TensorSpec:
        return spec(name, (size,), scales.norm_jitter, 1.0)

    if q_lora is None:
        specs = [spec("q_proj.weight", (q_rows, hidden), scales.qk_gain * hidden**-0.5)]
    else:
        specs = [
            spec("q_a_proj.weight", (q_lora, hidden), hidden**-0.5),
            norm("q_a_layernorm.weight", q_lora),
            spec("q_b_proj.weight", (q_rows, q_lora), scales.qk_gain * q_lora**-0.5),
        ]
    return specs + [
        spec("kv_a_proj_with_mqa.weight", (lora + rope, hidden), hidden**-0.5),
        norm("kv_a_layernorm.weight", lora),
        # keys and values from the (normalized) latent: keys at qk_gain, as q_proj's are
        spec("kv_b_proj.weight", (heads * (nope + v), lora), scales.qk_gain * lora**-0.5),
        spec("o_proj.weight", (hidden, heads * v), (heads * v) ** -0.5),
    ]


# model_type -> (MoE block, router, expert gate, up, down) names in the checkpoint
_EXPERT_NAMES = {
    "qwen3_moe": ("mlp", "gate", "gate_proj", "up_proj", "down_proj"),
    "mixtral": ("block_sparse_moe", "gate", "w1", "w3", "w2"),
    "deepseek_v2": ("mlp", "gate", "gate_proj", "up_proj", "down_proj"),
}


def _expert_specs(config: dict[str, Any], layer: int, proj_std: float) -> list[TensorSpec]:
    block, router, gate, up, down = _EXPERT_NAMES[config["model_type"]]
    prefix = f"model.layers.{layer}.{block}"
    hidden = config["hidden_size"]
    num_experts = (
        config.get("num_experts") or config.get("n_routed_experts") or config["num_local_experts"]
    )
    inter = config.get("moe_intermediate_size") or config["intermediate_size"]
    specs = [TensorSpec(f"{prefix}.{router}.weight", (num_experts, hidden), 0.0, proj_std)]
    for e in range(num_experts):
        expert = f"{prefix}.experts.{e}"
        specs.append(TensorSpec(f"{expert}.{gate}.weight", (inter, hidden), 0.0, proj_std))
        specs.append(TensorSpec(f"{expert}.{up}.weight", (inter, hidden), 0.0, proj_std))
        specs.append(TensorSpec(f"{expert}.{down}.weight", (hidden, inter), 0.0, inter**-0.5))
    if config.get("n_shared_experts"):  # DeepSeek-V2: one SwiGLU as wide as all shared experts
        shared, width = f"{prefix}.shared_experts", inter * config["n_shared_experts"]
        specs.append(TensorSpec(f"{shared}.gate_proj.weight", (width, hidden), 0.0, proj_std))
        specs.append(TensorSpec(f"{shared}.up_proj.weight", (width, hidden), 0.0, proj_std))
        specs.append(TensorSpec(f"{shared}.down_proj.weight", (hidden, width), 0.0, width**-0.5))
    return specs


def _gpt_oss_expert_specs(
    config: dict[str, Any], layer: int, proj_std: float, bias_std: float
) -> list[TensorSpec]:
    """gpt-oss's MoE block: a biased router and the experts stacked per layer in x @ W layout
    (gate and up columns interleaved), each projection with a bias."""
    prefix = f"model.layers.{layer}.mlp"
    hidden, inter, num_experts = (
        config["hidden_size"],
        config["intermediate_size"],
        config["num_local_experts"],
    )
    return [
        TensorSpec(f"{prefix}.router.weight", (num_experts, hidden), 0.0, proj_std),
        TensorSpec(f"{prefix}.router.bias", (num_experts,), 0.0, bias_std),
        TensorSpec(
            f"{prefix}.experts.gate_up_proj", (num_experts, hidden, 2 * inter), 0.0, proj_std
        ),
        TensorSpec(f"{prefix}.experts.gate_up_proj_bias", (num_experts, 2 * inter), 0.0, bias_std),
        TensorSpec(f"{prefix}.experts.down_proj", (num_experts, inter, hidden), 0.0, inter**-0.5),
        TensorSpec(f"{prefix}.experts.down_proj_bias", (num_experts, hidden), 0.0, bias_std),
    ]


def _tensor_seed(seed: int, preset: str, name: str) -> int:
    # Per-tensor seeds: a tensor's values do not depend on which other tensors exist. The
    # preset is mixed in so that presets with equal shapes still get different weights.
    digest = hashlib.sha256(f"{seed}:{preset}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def make_weights(
    config: dict[str, Any], preset: str, seed: int, scales: InitScales | None = None
) -> dict[str, torch.Tensor]:
    """Draw every tensor in float32 on the CPU from its own seeded generator, in a fixed order."""
    scales = scales or InitScales()
    weights: dict[str, torch.Tensor] = {}
    generator = torch.Generator(device="cpu")
    for spec in parameter_specs(config, scales):
        generator.manual_seed(_tensor_seed(seed, preset, spec.name))
        tensor = torch.randn(spec.shape, generator=generator, dtype=torch.float32)
        weights[spec.name] = tensor.mul_(spec.std).add_(spec.mean)
    if config["model_type"] == "phi3":
        _fuse_projections(weights, config["num_hidden_layers"])
    return weights


def _fuse_projections(weights: dict[str, torch.Tensor], num_layers: int) -> None:
    """Phi-3's checkpoint layout: q/k/v as one self_attn.qkv_proj, gate/up as one
    mlp.gate_up_proj (each drawn as its separate parts were)."""
    for i in range(num_layers):
        for prefix, parts, fused in (
            (f"model.layers.{i}.self_attn.", ("q_proj", "k_proj", "v_proj"), "qkv_proj"),
            (f"model.layers.{i}.mlp.", ("gate_proj", "up_proj"), "gate_up_proj"),
        ):
            tensors = [weights.pop(f"{prefix}{part}.weight") for part in parts]
            weights[f"{prefix}{fused}.weight"] = torch.cat(tensors)


def _shard(weights: dict[str, torch.Tensor], shard_size_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    shard_bytes = 0
    for name, tensor in weights.items():
        num_bytes = tensor.numel() * tensor.element_size()
        if shards[-1] and shard_bytes + num_bytes > shard_size_bytes:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(name)
        shard_bytes += num_bytes
    return shards


def _write_weights(
    out: Path, weights: dict[str, torch.Tensor], shard_size_bytes: int | None
) -> None:
    metadata = {"format": "pt"}
    if shard_size_bytes is None:
        save_file(weights, str(out / "model.safetensors"), metadata=metadata)
        return
    if shard_size_bytes <= 0:
        raise ValueError(f"shard_size_bytes must be positive, got {shard_size_bytes}")
    shards = _shard(weights, shard_size_bytes)
    weight_map: dict[str, str] = {}
    for index, names in enumerate(shards, start=1):
        filename = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: weights[n] for n in names}, str(out / filename), metadata=metadata)
        weight_map |= dict.fromkeys(names, filename)
    total_size = sum(t.numel() * t.element_size() for t in weights.values())
    index_json = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    write_json(out / "model.safetensors.index.json", index_json)


def make_checkpoint(
    out_dir: str | Path,
    preset: str,
    *,
    seed: int = 0,
    shard_size_bytes: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> Path:
    """Write config, generation config, tokenizer and random float32 weights to `out_dir`.

    The checkpoint is built in a temporary sibling directory and renamed into place, replacing
    a previous checkpoint there; the same arguments always produce byte-identical files.
    `shard_size_bytes` splits the weights into `model-0000X-of-0000N.safetensors` plus an index.
    """
    started = time.perf_counter()
    out = Path(out_dir).resolve()
    config = build_config(preset, overrides)
    if out.exists() and any(out.iterdir()) and not (out / "config.json").exists():
        raise FileExistsError(f"{out} exists and does not look like a checkpoint; not replacing")

    style = tokenizer_style(config)
    logger.info(
        "tokenizer: byte-level BPE (%s split), %d tokens, from %s",
        style,
        VOCAB_SIZE,
        CORPUS_PATH.name,
    )
    tokenizer_json(style)
    weights = make_weights(config, preset, seed)
    num_params = sum(t.numel() for t in weights.values())
    logger.info("weights: preset %s, seed %d, %s params (float32)", preset, seed, f"{num_params:,}")

    with written_whole(out) as tmp:
        write_json(tmp / "config.json", config)
        generation_config = {
            "bos_token_id": BOS_ID,
            # Chat replies end with <|im_end|>, plain completions with </s>.
            "eos_token_id": [EOS_ID, IM_END_ID],
            "pad_token_id": PAD_ID,
        }
        write_json(tmp / "generation_config.json", generation_config)
        write_tokenizer(tmp, config)
        _write_weights(tmp, weights, shard_size_bytes)
    logger.info("wrote %s in %.1fs", out, time.perf_counter() - started)
    return out


def ensure_checkpoint(out_dir: str | Path, preset: str) -> Path:
    """The checkpoint in `out_dir`, first made by `make_checkpoint(out_dir, preset)` where
    there is none (no config.json); one already there is kept as it is."""
    out = Path(out_dir)
    if not (out / "config.json").is_file():
        make_checkpoint(out, preset)
    return out


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: ``python -m quire_tools.make_model --preset tiny --out DIR``."""
    parser = argparse.ArgumentParser(description="Generate a random-weight checkpoint.")
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--out", required=True, type=Path, help="checkpoint directory to write")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument(
        "--shard-size-mb", type=float, default=None, help="split weights into shards of this size"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    shard_size_bytes = None if args.shard_size_mb is None else int(args.shard_size_mb * 2**20)
    make_checkpoint(args.out, args.preset, seed=args.seed, shard_size_bytes=shard_size_bytes)


if __name__ == "__main__":
    main()
