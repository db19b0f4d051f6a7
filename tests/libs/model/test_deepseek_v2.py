"""DeepSeek-V2's config (MLA shape, experts, YaRN and its softmax scale), its rotary tables
against transformers', and the row order that turns interleaved rotary pairs into halves."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import quire.kernels as kernels
from quire.model.mla import deinterleave
from quire.model.model_config import ModelConfig
from quire.model.rope import RotaryEmbedding

YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
}


def hf_config(**fields: Any) -> Any:
    from transformers import DeepseekV2Config

    shape: dict[str, Any] = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "kv_lora_rank": 32,
        "q_lora_rank": None,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 2,
        "moe_intermediate_size": 24,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 4096 * 40,
    }
    return DeepseekV2Config(**(shape | fields))


def test_v2_lite_shape_reads_mla_experts_and_yarn() -> None:
    config = ModelConfig.from_hf(hf_config(rope_parameters=dict(YARN), routed_scaling_factor=1.0))
    assert config.mla is not None and config.moe is not None
    assert config.mla.q_lora_rank is None and config.mla.latent_dim == 32 + 8
    assert config.head_dim == 8  # the rotary dims: what the rotary table is built over
    assert config.moe.sparse_layers == (1, 2, 3) and config.moe.num_shared_experts == 2
    assert not config.moe.normalize_top_k and config.moe.routed_scaling_factor == 1.0
    assert config.rope.rope_type == "yarn" and config.rope.attention_factor == 1.0
    # transformers: (nope + rope)^-0.5 * mscale(40, 0.707)^2
    mscale = 0.1 * 0.707 * math.log(40) + 1
    assert config.mla.softmax_scale == pytest.approx(24**-0.5 * mscale**2)


def test_q_lora_plain_rope_every_layer_sparse() -> None:
    config = ModelConfig.from_hf(
        hf_config(q_lora_rank=48, first_k_dense_replace=0, routed_scaling_factor=16.0)
    )
    assert config.mla is not None and config.moe is not None
    assert config.mla.q_lora_rank == 48 and config.mla.softmax_scale == pytest.approx(24**-0.5)
    assert config.moe.sparse_layers == (0, 1, 2, 3) and config.moe.routed_scaling_factor == 16.0
    assert config.rope.rope_type == "default"


def test_group_limited_routing_is_refused() -> None:
    hf = hf_config(topk_method="group_limited_greedy", n_group=2, topk_group=1)
    with pytest.raises(ValueError, match="only greedy"):
        ModelConfig.from_hf(hf)


@pytest.mark.parametrize(
    "rope",
    [
        YARN,  # DeepSeek-V2-Lite: mscale = mscale_all_dim, cos and sin unscaled
        {"rope_type": "yarn", "rope_theta": 5000.0, "factor": 8.0,
         "original_max_position_embeddings": 128},  # cos and sin scaled by mscale(8)
        {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
         "original_max_position_embeddings": 256, "beta_fast": 16, "beta_slow": 2,
         "mscale": 1.0, "mscale_all_dim": 0.5},
    ],
)  # fmt: skip
def test_yarn_tables_match_transformers(rope: dict[str, Any]) -> None:
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RotaryEmbedding

    max_positions = int(rope["factor"] * rope["original_max_position_embeddings"])
    hf = hf_config(rope_parameters=dict(rope), max_position_embeddings=max_positions)
    config = ModelConfig.from_hf(hf)
    theirs = DeepseekV2RotaryEmbedding(hf)
    positions = torch.arange(0, max_positions, 97)
    freqs_cis = theirs(torch.zeros(1), positions[None])[0]  # [positions, rope / 2] complex
    ours = RotaryEmbedding(config.rope, config.head_dim, max_positions, torch.device("cpu"))
    half = config.head_dim // 2
    torch.testing.assert_close(ours.cos[positions, :half], freqs_cis.real)
    torch.testing.assert_close(ours.sin[positions, half:], freqs_cis.imag)
    assert config.rope.attention_factor == pytest.approx(theirs.attention_scaling)


def test_deinterleaved_rows_rotate_as_transformers_pairs() -> None:
    # transformers rotates (x0, x1), (x2, x3), ... as complex numbers; the deinterleaved rows
    # under the rotate-half kernel give the same values, evens first.
    nope, rope, heads = 3, 8, 2
    weight = torch.randn(heads * (nope + rope), 5)
    x = torch.randn(4, 5)
    positions = torch.arange(4)
    angles = positions[:, None].float() * torch.rand(rope // 2)[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], -1)
    sin = torch.cat([angles.sin(), angles.sin()], -1)
    q = (x @ weight.T).view(4, heads, nope + rope)[..., nope:]
    pairs = torch.view_as_complex(q.reshape(4, heads, rope // 2, 2).contiguous())
    theirs = torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)[:, None])
    ours = (x @ deinterleave(weight, nope, rope).T).view(4, heads, nope + rope)[..., nope:]
    key = ours[:, :1].clone()
    kernels.rotary_embedding_(positions, ours, key, cos, sin)
    torch.testing.assert_close(ours[..., : rope // 2], theirs[..., 0])
    torch.testing.assert_close(ours[..., rope // 2 :], theirs[..., 1])
