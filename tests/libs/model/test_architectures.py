"""Which architectures load, what their configs become, and the refusal of the others."""

from __future__ import annotations

from typing import Any

import pytest

from quire.model.architectures import ARCHITECTURES, SUPPORTED_ARCHITECTURES, model_class
from quire.model.decoder import DecoderModel
from quire.model.model_config import ModelConfig


@pytest.mark.parametrize("architecture", SUPPORTED_ARCHITECTURES)
def test_every_supported_architecture_has_a_model(architecture: str) -> None:
    cls = model_class(architecture)
    assert issubclass(cls, DecoderModel) and cls is not DecoderModel
    assert cls.load_mlp is not DecoderModel.load_mlp


def test_an_unsupported_architecture_is_refused_with_the_supported_list() -> None:
    from transformers import GPT2Config

    hf = GPT2Config(architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match=r"unsupported architecture \(GPT2LMHeadModel\)") as exc:
        ModelConfig.from_hf(hf)
    assert all(arch in str(exc.value) for arch in ARCHITECTURES)
    with pytest.raises(ValueError, match=r"unsupported architecture \(GPT2LMHeadModel\)"):
        model_class("GPT2LMHeadModel")


def _qwen3_moe(**fields: Any) -> ModelConfig:
    from transformers import Qwen3MoeConfig

    shape: dict[str, Any] = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 32,
    }
    hf = Qwen3MoeConfig(architectures=["Qwen3MoeForCausalLM"], **shape, **fields)
    return ModelConfig.from_hf(hf)


def test_qwen3_moe_sparse_layers_follow_the_step_and_the_dense_list() -> None:
    config = _qwen3_moe(
        num_hidden_layers=6,
        decoder_sparse_step=2,
        mlp_only_layers=[3],
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=48,
        norm_topk_prob=False,
    )
    assert config.moe is not None
    assert config.moe.sparse_layers == (1, 5)  # layers 1, 3, 5 by the step; 3 kept dense
    assert (config.moe.num_experts, config.moe.top_k, config.moe.intermediate_size) == (16, 4, 48)
    assert not config.moe.normalize_top_k
    assert config.head_dim == 32 and not config.qkv_bias
    all_dense = _qwen3_moe(num_hidden_layers=2, mlp_only_layers=[0, 1])
    assert all_dense.moe is None


def test_mixtral_is_sparse_everywhere_and_renormalizes() -> None:
    from transformers import MixtralConfig

    hf = MixtralConfig(
        architectures=["MixtralForCausalLM"],
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=3,
        intermediate_size=96,
        num_local_experts=8,
        num_experts_per_tok=2,
    )
    config = ModelConfig.from_hf(hf)
    assert config.moe is not None
    assert config.moe.sparse_layers == (0, 1, 2) and config.moe.normalize_top_k
    assert (config.moe.num_experts, config.moe.top_k, config.moe.intermediate_size) == (8, 2, 96)
    assert config.head_dim == 16


def test_qwen3_reads_head_dim_and_attention_bias() -> None:
    from transformers import Qwen3Config

    shape: dict[str, Any] = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 48,
    }
    plain = ModelConfig.from_hf(Qwen3Config(architectures=["Qwen3ForCausalLM"], **shape))
    assert plain.head_dim == 48 and not plain.qkv_bias and not plain.o_bias and plain.moe is None
    biased = Qwen3Config(architectures=["Qwen3ForCausalLM"], attention_bias=True, **shape)
    assert ModelConfig.from_hf(biased).qkv_bias and ModelConfig.from_hf(biased).o_bias


def test_gpt_oss_config_as_released() -> None:
    """The released gpt-oss shape (transformers' GptOssConfig defaults): every layer sparse
    with biased experts and the clamped SwiGLU, sliding and global layers alternating from a
    sliding first, untruncated YaRN over a 4,096-token original context, biased attention."""
    from transformers import GptOssConfig

    config = ModelConfig.from_hf(
        GptOssConfig(architectures=["GptOssForCausalLM"], num_hidden_layers=4)
    )
    assert config.moe is not None and config.moe.biases and config.moe.normalize_top_k
    assert config.moe.clamp is not None
    assert (config.moe.clamp.alpha, config.moe.clamp.limit) == (1.702, 7.0)
    assert config.moe.sparse_layers == (0, 1, 2, 3)
    assert (config.moe.num_experts, config.moe.top_k) == (128, 4)
    assert config.attention.sliding_window == 128
    assert config.attention.sliding_layers == (0, 2)
    assert config.qkv_bias and config.o_bias
    rope = config.rope
    assert (rope.rope_type, rope.factor, rope.truncate) == ("yarn", 32.0, False)
    assert rope.original_max_position_embeddings == 4096 and rope.theta == 150000.0


def test_an_unsupported_quantization_is_refused_by_name() -> None:
    from transformers import GptOssConfig

    hf = GptOssConfig(
        architectures=["GptOssForCausalLM"],
        num_hidden_layers=2,
        quantization_config={"quant_method": "mxfp4"},
    )
    with pytest.raises(ValueError, match=r"quantization method 'mxfp4' is not supported \(awq"):
        ModelConfig.from_hf(hf)
