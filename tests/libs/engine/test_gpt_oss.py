"""gpt-oss's own parts each decide tokens: with the sinks, the clamp or the expert biases
left out, greedy output leaves transformers' (test_hf_equivalence shows it equal with them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from quire import LLM, SamplingParams
from quire.model.decoder import DecoderModel
from quire.model.layers import Attention
from quire.model.moe import SparseMoE
from tests.libs.engine.conftest import HFOracle
from tests.libs.engine.test_hf_equivalence import random_prompts


def _drop_sinks(model: DecoderModel) -> None:
    for layer in model.layers:
        assert isinstance(layer.attention, Attention) and layer.attention.paged.sinks is not None
        layer.attention.paged.sinks = None


def _drop_clamp(model: DecoderModel) -> None:
    for layer in model.layers:
        assert isinstance(layer.mlp, SparseMoE) and layer.mlp.clamp is not None
        layer.mlp.clamp = None


def _drop_expert_biases(model: DecoderModel) -> None:
    for layer in model.layers:
        assert isinstance(layer.mlp, SparseMoE) and layer.mlp.gate_up_bias is not None
        layer.mlp.gate_up_bias = layer.mlp.down_bias = None


@pytest.mark.parametrize("drop", [_drop_sinks, _drop_clamp, _drop_expert_biases])
def test_each_gpt_oss_part_changes_the_tokens(
    drop: Callable[[DecoderModel], None],
    model_zoo: dict[str, Path],
    oracles: dict[str, HFOracle],
) -> None:
    llm = LLM(model=str(model_zoo["tiny-gpt-oss"]), dtype="float32")
    drop(llm.engine.model)
    prompts = random_prompts(llm.engine.model.config.vocab_size, seed=7)[4:12]
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=12),
        use_tqdm=False,
    )
    oracle = oracles["tiny-gpt-oss"]
    differing = [
        i
        for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True))
        if list(out.outputs[0].token_ids) != oracle.generate(prompt, 12).token_ids
    ]
    assert differing, f"{drop.__name__}: every prompt still matched transformers"
