"""Sliding windows, soft caps and Gemma's scaling read from transformers configs, and each of
them changing the tokens (so the float32 equivalence tests would catch a kernel that ignored
it)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from quire_tools.make_model import build_config, make_checkpoint
from transformers import AutoConfig

from quire import LLM, SamplingParams
from quire.model import fused_layer
from quire.model.attention_layout import AttentionLayout, KVGroups, kv_groups
from quire.model.model_config import ModelConfig
from tests.libs.engine.conftest import HFOracle


def _config(preset: str, **overrides: object) -> ModelConfig:
    hf = AutoConfig.for_model(**build_config(preset, dict(overrides)))
    return ModelConfig.from_hf(hf)


def test_mistral_window_covers_every_layer_and_no_longer_caps_the_length() -> None:
    config = _config("tiny-mistral-window")
    assert config.attention.sliding_layers == (0, 1, 2, 3)
    assert [config.attention.window(i) for i in range(4)] == [24] * 4
    assert config.attention.freeable_window(4) == 24
    assert config.max_model_len == 2048  # was the window before windows were exact
    assert _config("tiny-mistral").attention == AttentionLayout()


def test_gemma2_alternates_windows_and_caps_scores() -> None:
    config = _config("tiny-gemma2")
    assert config.attention.sliding_layers == (0, 2)
    assert config.attention.window(1) is None and config.attention.window(2) == 16
    assert config.attention.freeable_window(4) is None  # global layers read every block
    assert config.attention.logits_soft_cap == 3.0
    assert config.final_logit_soft_cap == 15.0
    assert config.scale == pytest.approx(48**-0.5)  # query_pre_attn_scalar, not head_dim 64
    assert config.hidden_activation == "gelu_pytorch_tanh"
    assert config.local_rope is None


def test_gemma3_has_a_rope_per_layer_type_and_no_attention_cap() -> None:
    config = _config("tiny-gemma3", attn_logit_softcapping=50.0)
    assert config.attention.sliding_layers == (0, 1, 3)
    assert config.rope.theta == 1_000_000.0
    assert config.local_rope is not None and config.local_rope.theta == 10_000.0
    assert config.attention.logits_soft_cap is None  # transformers' Gemma 3 ignores it
    legacy = _config("tiny-gemma3", rope_parameters=None, rope_theta=5e5, rope_local_base_freq=7e3)
    assert (legacy.rope.theta, legacy.local_rope and legacy.local_rope.theta) == (5e5, 7e3)


def test_a_qwen2_window_applies_from_max_window_layers() -> None:
    config = _config("tiny-qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=2)
    assert config.attention.sliding_layers == (2, 3)
    assert config.attention.freeable_window(4) is None


def _mismatches(llm: LLM, oracle: HFOracle, prompts: list[list[int]]) -> int:
    params = SamplingParams(temperature=0, max_tokens=8)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return sum(
        list(out.outputs[0].token_ids) != oracle.generate(p, 8).token_ids
        for p, out in zip(prompts, outputs, strict=True)
    )


_checkpoints: dict[str, Path] = {}


@pytest.mark.parametrize(
    ("name", "feature"),
    [
        ("tiny-mistral-window", "sliding_window"),
        ("tiny-gemma2", "sliding_window"),
        ("tiny-gemma2", "logits_soft_cap"),
        ("tiny-gemma3", "sliding_window"),
    ],
)
def test_each_attention_feature_changes_the_tokens(
    name: str, feature: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = _checkpoints.get(name)
    if path is None:
        path = _checkpoints[name] = make_checkpoint(tmp_path_factory.mktemp(name), name, seed=9)
    oracle = HFOracle(path)
    llm = LLM(model=str(path), dtype="float32")
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in (60, 90, 120)]
    assert _mismatches(llm, oracle, prompts) == 0
    model: Any = llm.engine.model
    for layer in model.layers:
        setattr(layer.attention.paged, feature, None)
    if model.fused_layers is not None:  # the C++ layers took the attention's features at load
        model.fused_layers = fused_layer.fuse(model.layers, torch.device("cpu"))
    assert _mismatches(llm, oracle, prompts) > 0, f"{name} without {feature}"


def _layout(num_layers: int, global_layers: set[int], window: int = 16) -> AttentionLayout:
    sliding = tuple(i for i in range(num_layers) if i not in global_layers)
    return AttentionLayout(sliding_window=window if sliding else None, sliding_layers=sliding)


def test_kv_groups_of_alternating_layers_are_two_groups_of_half_the_layers() -> None:
    groups = kv_groups(_layout(4, {1, 3}), 4, free_outside_window=True)  # Gemma 2, gpt-oss
    assert groups.windows == (None, 16)
    assert groups.layer_groups == (1, 0, 1, 0) and groups.layer_slots == (0, 0, 1, 1)
    assert groups.num_slots == 2 and groups.num_padded_slots == 0


def test_kv_groups_of_gemma3_s_five_to_one_pattern() -> None:
    groups = kv_groups(_layout(6, {5}), 6, free_outside_window=True)
    assert groups.windows == (None, 16, 16, 16, 16, 16) and groups.num_slots == 1
    assert groups.layer_groups == (1, 2, 3, 4, 5, 0)
    # 26 layers, every 6th global (Gemma 3 1B): groups of 4, the last sliding one half used
    groups = kv_groups(_layout(26, {5, 11, 17, 23}), 26, free_outside_window=True)
    assert groups.num_slots == 4 and groups.windows == (None,) + (16,) * 6
    assert groups.num_padded_slots == 2
    assert [groups.layer_groups[i] for i in (5, 11, 17, 23)] == [0, 0, 0, 0]
    assert groups.layer_groups[25] == 6 and groups.layer_slots[25] == 1


def test_kv_groups_are_one_table_unless_a_hybrid_model_frees() -> None:
    assert kv_groups(_layout(4, set()), 4, True) == KVGroups.single(4, 16)  # Mistral
    assert kv_groups(_layout(4, {0, 1, 2, 3}), 4, True) == KVGroups.single(4)  # no window
    assert kv_groups(_layout(4, {1, 3}), 4, free_outside_window=False) == KVGroups.single(4)
    assert kv_groups(_layout(4, set()), 4, free_outside_window=False) == KVGroups.single(4)
    with pytest.raises(ValueError, match="share"):
        KVGroups((None,), (0, 0), (0, 0), 1)
