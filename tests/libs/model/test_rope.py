"""Rotary tables against transformers' own (Phi-3's LongRoPE, partial rotary) and what a
Phi-3 config becomes."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from quire.model.model_config import ModelConfig, RopeConfig
from quire.model.rope import RotaryEmbedding

HEAD_DIM = 64
ORIGINAL_MAX = 32


def _phi3(rope: dict[str, Any], **fields: Any) -> Any:
    from transformers import Phi3Config

    pairs = int(HEAD_DIM * rope.get("partial_rotary_factor", 1.0)) // 2
    scaling = {"short_factor": [1.0 + 0.1 * i for i in range(pairs)]}
    scaling["long_factor"] = [1.0 + 2.0 * i for i in range(pairs)]
    if rope.get("rope_type") == "su":  # transformers renames it after checking for this key
        scaling["original_max_position_embeddings"] = ORIGINAL_MAX
    fields.setdefault("max_position_embeddings", 256)
    return Phi3Config(
        architectures=["Phi3ForCausalLM"],
        hidden_size=2 * HEAD_DIM,
        num_attention_heads=2,
        num_key_value_heads=1,
        original_max_position_embeddings=ORIGINAL_MAX,
        rope_parameters={"rope_theta": 10000.0, **scaling, **rope},
        **fields,
    )


def _transformers_tables(hf: Any, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of transformers' Phi-3 rotary for positions 0..seq_len-1 in one forward
    (it picks the long factors when seq_len exceeds original_max_position_embeddings)."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    rotary = Phi3RotaryEmbedding(hf)
    positions = torch.arange(seq_len).unsqueeze(0)
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
    return cos[0], sin[0]


@pytest.mark.parametrize("partial", [1.0, 0.75])
@pytest.mark.parametrize("rope_type", ["longrope", "su"])
def test_longrope_tables_equal_transformers_in_both_regimes(partial: float, rope_type: str) -> None:
    hf = _phi3({"rope_type": rope_type, "partial_rotary_factor": partial})
    config = ModelConfig.from_hf(hf)
    assert config.rope.rope_type == "longrope"
    rotary_dim = int(HEAD_DIM * partial)
    # Served context past original_max_position_embeddings: the long factors everywhere, as
    # transformers computes a sequence longer than that.
    long = RotaryEmbedding(config.rope, HEAD_DIM, 256, torch.device("cpu"))
    cos, sin = _transformers_tables(hf, 256)
    assert long.rotary_dim == rotary_dim and long.cos.shape == (256, rotary_dim)
    assert torch.equal(long.cos, cos) and torch.equal(long.sin, sin)
    # Context capped at it: the short factors, as transformers computes any sequence that fits.
    short = RotaryEmbedding(config.rope, HEAD_DIM, ORIGINAL_MAX, torch.device("cpu"))
    cos, sin = _transformers_tables(hf, ORIGINAL_MAX)
    assert torch.equal(short.cos, cos) and torch.equal(short.sin, sin)
    assert not torch.equal(short.cos, long.cos[:ORIGINAL_MAX])


def test_longrope_attention_factor_follows_transformers() -> None:
    config = ModelConfig.from_hf(_phi3({"rope_type": "longrope"}))
    # max_position_embeddings / original = 8: sqrt(1 + ln 8 / ln 32)
    assert config.rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(8) / math.log(32)))
    given = ModelConfig.from_hf(_phi3({"rope_type": "longrope", "attention_factor": 1.25}))
    assert given.rope.attention_factor == 1.25
    unscaled = ModelConfig.from_hf(_phi3({"rope_type": "longrope"}, max_position_embeddings=32))
    assert unscaled.rope.attention_factor == 1.0


def test_plain_phi3_rope_and_partial_rotary() -> None:
    from transformers import Phi3Config

    hf = Phi3Config(
        architectures=["Phi3ForCausalLM"],
        hidden_size=128,
        num_attention_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
    )
    config = ModelConfig.from_hf(hf)
    assert config.architecture == "Phi3ForCausalLM" and config.head_dim == 64
    assert config.rope.rope_type == "default" and config.rope.rotary_dim(64) == 32
    rotary = RotaryEmbedding(config.rope, 64, 40, torch.device("cpu"))
    cos, sin = _transformers_tables(hf, 40)
    assert torch.equal(rotary.cos, cos) and torch.equal(rotary.sin, sin)


def test_longrope_needs_both_factor_lists() -> None:
    with pytest.raises(ValueError, match="short_factor and long_factor"):
        RopeConfig(rope_type="longrope", short_factor=(1.0, 1.0), long_factor=(1.0,))
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        RopeConfig(partial_rotary_factor=0.0)
    rope = RopeConfig(rope_type="longrope", short_factor=(1.0,) * 4, long_factor=(2.0,) * 4)
    with pytest.raises(ValueError, match="4 factors for 32 rotary pairs"):
        RotaryEmbedding(rope, 64, 16, torch.device("cpu"))
