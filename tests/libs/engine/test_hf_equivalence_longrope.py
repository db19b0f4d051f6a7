"""Phi-3 with LongRoPE gives transformers' greedy tokens in every engine mode, in both of its
regimes: serving a context longer than original_max_position_embeddings (the long factors,
which transformers uses for every sequence longer than that) and a context capped at it (the
short factors). quire.model.rope says why the regime is the served context's, not each
sequence's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from quire_tools.make_model import LONGROPE_ORIGINAL_MAX

from quire import LLM
from tests.libs.engine.conftest import HFOracle
from tests.libs.engine.test_hf_equivalence import run_and_compare

MODEL = "tiny-phi3-longrope"
# Every prompt longer than original_max_position_embeddings (64), as the long regime needs.
LONG_PROMPT_LENGTHS = [65, 66, 80, 96, 129, 150, 201, 256]
# Ten of them over a 12-block pool: the scheduler preempts one (recompute) and resumes it.
PREEMPTED_PROMPT_LENGTHS = [65, 66, 67, 70, 72, 75, 78, 80, 96, 129]
# Prompt + max_tokens (run_and_compare's) within 64, as the short regime needs.
SHORT_PROMPT_LENGTHS = [1, 7, 16, 17, 33, 40]


def prompts_of(lengths: list[int], vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]


def long_shared_prefix_prompts(vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for prefix_len in (65, 100):
        prefix = [rng.randrange(3, vocab_size) for _ in range(prefix_len)]
        prompts += [prefix + [rng.randrange(3, vocab_size) for _ in range(n)] for n in (1, 16, 30)]
    return prompts


@pytest.fixture(scope="module")
def path(model_zoo: dict[str, Path]) -> Path:
    return model_zoo[MODEL]


@pytest.fixture(scope="module")
def oracle(oracles: dict[str, HFOracle]) -> HFOracle:
    return oracles[MODEL]


def test_long_context_plain_and_chunked(path: Path, oracle: HFOracle) -> None:
    assert LONG_PROMPT_LENGTHS[0] > LONGROPE_ORIGINAL_MAX
    llm = LLM(model=str(path), dtype="float32")
    prompts = prompts_of(LONG_PROMPT_LENGTHS, llm.engine.model.config.vocab_size, seed=3)
    run_and_compare(llm, oracle, prompts, "longrope/plain")
    chunked = LLM(model=str(path), dtype="float32", max_num_batched_tokens=24)
    run_and_compare(chunked, oracle, prompts, "longrope/chunked")
    assert chunked.stats().num_steps > 256 // 24


def test_long_context_preemption(path: Path, oracle: HFOracle) -> None:
    llm = LLM(model=str(path), dtype="float32", num_kv_blocks=12, max_num_seqs=10)
    prompts = prompts_of(PREEMPTED_PROMPT_LENGTHS, llm.engine.model.config.vocab_size, seed=4)
    run_and_compare(llm, oracle, prompts, "longrope/preempt")
    assert llm.stats().num_preemptions > 0, "the pool was meant to force preemption"


def test_long_context_prefix_caching(path: Path, oracle: HFOracle) -> None:
    llm = LLM(model=str(path), dtype="float32", max_num_seqs=2)
    prompts = long_shared_prefix_prompts(llm.engine.model.config.vocab_size, seed=5)
    run_and_compare(llm, oracle, prompts, "longrope/prefix")
    assert llm.stats().allocator.prefix_cache_hits > 0


def test_context_capped_at_the_original_length(path: Path, oracle: HFOracle) -> None:
    llm = LLM(model=str(path), dtype="float32", max_model_len=LONGROPE_ORIGINAL_MAX)
    assert llm.engine.max_model_len == LONGROPE_ORIGINAL_MAX
    prompts = prompts_of(SHORT_PROMPT_LENGTHS, llm.engine.model.config.vocab_size, seed=6)
    run_and_compare(llm, oracle, prompts, "longrope-capped/plain")
    prefix = LLM(
        model=str(path), dtype="float32", max_model_len=LONGROPE_ORIGINAL_MAX, max_num_seqs=2
    )
    shared = [prompts[-1][:32] + p[:8] for p in prompts]
    run_and_compare(prefix, oracle, shared, "longrope-capped/prefix")
    assert prefix.stats().allocator.prefix_cache_hits > 0
