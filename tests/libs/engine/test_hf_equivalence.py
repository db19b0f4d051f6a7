"""Greedy output equals transformers generate() token for token, in every engine mode."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from quire import LLM, SamplingParams
from quire.model.attention_layout import kv_groups
from quire.model.checkpoint import load_model_config
from tests.hardware import needs_packed_linear
from tests.libs.engine.conftest import SHAPE_VARIANTS, HFOracle, assert_matches_reference

PROMPT_LENGTHS = [1, 2, 7, 15, 16, 17, 31, 32, 33, 48, 64, 100, 150, 201, 256, 300]
MAX_TOKENS = [12, 1, 9, 17, 16, 5, 24, 3, 15, 33, 8, 20, 2, 11, 18, 6]


def random_prompts(vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in PROMPT_LENGTHS]


def shared_prefix_prompts(vocab_size: int, seed: int) -> list[list[int]]:
    """Four families of prompts, each family sharing a long common prefix."""
    rng = random.Random(seed)
    prompts = []
    for prefix_len in (20, 40, 64, 100):
        prefix = [rng.randrange(3, vocab_size) for _ in range(prefix_len)]
        for suffix_len in (1, 9, 16, 30):
            prompts.append(prefix + [rng.randrange(3, vocab_size) for _ in range(suffix_len)])
    return prompts


def run_and_compare(llm: LLM, oracle: HFOracle, prompts: list[list[int]], label: str) -> None:
    params = [SamplingParams(temperature=0, max_tokens=m) for m in MAX_TOKENS[: len(prompts)]]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for i, (prompt, out, p) in enumerate(zip(prompts, outputs, params, strict=True)):
        ref = oracle.generate(prompt, p.max_tokens)
        assert_matches_reference(
            out.outputs[0].token_ids, ref, f"{label} prompt {i} (len {len(prompt)})"
        )
    assert llm.stats().allocator.num_blocks_used == 0, "blocks leaked after generate()"


MODELS = [
    "tiny",
    "tiny-mqa",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-qwen3-moe",
    "tiny-mixtral",
    "tiny-phi3",
    "tiny-mistral-window",
    "tiny-gemma2",
    "tiny-gemma3",
    "tiny-deepseek-v2",
    "tiny-deepseek-v2-q-lora",
    "tiny-gpt-oss",
    "tiny-gpt-oss-mqa",
]
# Run under Quire's own packed kernel too. The other architectures' dense projections are the
# same Linear layers, so the measured choice covers them.
PACKED_MODELS = ["tiny", "tiny-mqa", "tiny-qwen2"]
CASES = [pytest.param(name, "auto", id=f"auto-{name}") for name in MODELS] + [
    pytest.param(name, "packed", marks=needs_packed_linear(torch.float32), id=f"packed-{name}")
    for name in PACKED_MODELS
]
# Other shapes of the same architectures (conftest's SHAPE_VARIANTS): the plain mode only.
SHAPES = [pytest.param(name, "auto", id=f"auto-{name}") for name, *_ in SHAPE_VARIANTS]


@pytest.fixture(autouse=True)
def linear_backend(backend: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every mode under the measured choice and under Quire's own packed kernel by name."""
    monkeypatch.setenv("QUIRE_LINEAR_BACKEND", backend)
    return backend


@pytest.mark.parametrize(("name", "backend"), CASES + SHAPES)
def test_plain(
    name: str, model_zoo: dict[str, Path], oracles: dict[str, HFOracle], linear_backend: str
) -> None:
    llm = LLM(model=str(model_zoo[name]), dtype="float32")
    if linear_backend != "auto":
        assert llm.engine.model.linear_backend == linear_backend
        assert llm.engine.model.lm_head.backend == linear_backend
    vocab = llm.engine.model.config.vocab_size
    run_and_compare(llm, oracles[name], random_prompts(vocab, seed=7), f"{name}/plain")


@pytest.mark.parametrize(("name", "backend"), CASES)
def test_preemption(name: str, model_zoo: dict[str, Path], oracles: dict[str, HFOracle]) -> None:
    # 24 blocks of 16 tokens cannot hold all 16 prompts at once: sequences get preempted
    # (swapped out) and come back, and must still produce the reference tokens. A model whose
    # every layer slides releases blocks outside its window as it goes: 22 blocks for it. A
    # hybrid model has a table per KV group, its sliding groups releasing what they no longer
    # read: 21 blocks per group.
    config = load_model_config(model_zoo[name])
    groups = kv_groups(config.attention, config.num_layers, free_outside_window=True)
    num_kv_blocks = 21 * groups.num_groups if groups.is_grouped else 24
    if name == "tiny-mistral-window":
        num_kv_blocks = 22
    llm = LLM(
        model=str(model_zoo[name]), dtype="float32", num_kv_blocks=num_kv_blocks, max_num_seqs=16
    )
    vocab = llm.engine.model.config.vocab_size
    run_and_compare(llm, oracles[name], random_prompts(vocab, seed=7), f"{name}/preempt")
    assert llm.stats().num_preemptions > 0, "the pool was meant to force preemption"


@pytest.mark.parametrize(("name", "backend"), CASES)
def test_prefix_caching(
    name: str, model_zoo: dict[str, Path], oracles: dict[str, HFOracle]
) -> None:
    # max_num_seqs=2 makes later family members arrive after earlier ones computed the prefix.
    llm = LLM(model=str(model_zoo[name]), dtype="float32", max_num_seqs=2)
    vocab = llm.engine.model.config.vocab_size
    prompts = shared_prefix_prompts(vocab, seed=11)
    run_and_compare(llm, oracles[name], prompts, f"{name}/prefix")
    stats = llm.stats().allocator
    assert stats.prefix_cache_hits > 0, "shared prefixes were meant to hit the cache"
    # Running them again hits even more: the freed blocks stayed cached.
    before = stats.prefix_cache_hits
    run_and_compare(llm, oracles[name], prompts, f"{name}/prefix-again")
    assert (
        llm.stats().allocator.prefix_cache_hits - before
        >= sum((len(p) - 1) // 16 * 16 for p in prompts) * 0.5
    )


@pytest.mark.parametrize(("name", "backend"), CASES)
def test_chunked_prefill(
    name: str, model_zoo: dict[str, Path], oracles: dict[str, HFOracle]
) -> None:
    llm = LLM(model=str(model_zoo[name]), dtype="float32", max_num_batched_tokens=24)
    vocab = llm.engine.model.config.vocab_size
    run_and_compare(llm, oracles[name], random_prompts(vocab, seed=7), f"{name}/chunked")
    assert llm.stats().num_steps > 300 // 24, "long prompts were meant to be chunked"
    # every step runs every decoder layer once: the heartbeat's in-step liveness counter
    model = llm.engine.model
    assert model.layers_run == llm.stats().num_steps * model.config.num_layers
