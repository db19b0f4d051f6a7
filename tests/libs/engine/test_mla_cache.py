"""DeepSeek-V2's latent cache in the engine: the pool is sized by an MLA layer's bytes per
token, and preemption by swap (blocks out to host memory and back, in the latent's shape)
gives transformers' greedy tokens, as recompute and no preemption do."""

from __future__ import annotations

from pathlib import Path

import torch

from quire import LLM
from quire.cache.paged_kv import kv_bytes_per_token
from quire.config import DEFAULT_CPU_KV_CACHE_BYTES, EngineConfig
from quire.engine.loading import LoadedModel, num_kv_blocks
from tests.libs.engine.conftest import HFOracle, assert_matches_reference
from tests.libs.engine.test_swap_preemption import (
    BOUNDARY_LENGTHS,
    BOUNDARY_MAX_TOKENS,
    check_modes_agree,
    greedy,
    prompts,
    run,
)

NAME = "tiny-deepseek-v2"


def test_the_pool_holds_one_latent_per_token_and_layer(model_zoo: dict[str, Path]) -> None:
    llm = LLM(model=str(model_zoo[NAME]), dtype="float32", num_kv_blocks=8)
    config = llm.engine.model.config
    assert config.mla is not None
    kv = llm.engine.runner.kv
    # 3 layers x (64 + 16) float32 values: 960 bytes, where keys and values per head would
    # take 3 layers x 4 heads x (64 + 32) x 4 = 4,608
    assert kv_bytes_per_token(config, torch.float32) == 3 * 80 * 4
    assert kv.block_shape == (3, 1, 16, 1, 80) and kv.bytes_per_block == 16 * 960
    assert all(latent.shape == (8, 16, 1, 80) for (latent,) in kv.layers)
    # The default budget counts blocks of that size: 4.8x as many as per-head keys and
    # values would get.
    engine = llm.engine
    loaded = LoadedModel(
        Path(engine.config.model),
        kv.device,
        kv.dtype,
        engine.model,
        engine.tokenizer,
        4096,
        frozenset(),
    )
    budget_blocks = DEFAULT_CPU_KV_CACHE_BYTES // (16 * 960)
    assert num_kv_blocks(EngineConfig(model=engine.config.model, max_num_seqs=1024), loaded) == (
        budget_blocks
    )


def test_swap_gives_transformers_tokens(
    model_zoo: dict[str, Path], oracles: dict[str, HFOracle]
) -> None:
    model = model_zoo[NAME]
    token_prompts = prompts(1000, BOUNDARY_LENGTHS, seed=3)
    params = greedy(BOUNDARY_MAX_TOKENS)
    expected, _, _ = run(model, token_prompts, params, num_kv_blocks=512, max_num_seqs=12)
    for i, (prompt, outputs, p) in enumerate(zip(token_prompts, expected, params, strict=True)):
        ref = oracles[NAME].generate(prompt, p.max_tokens)
        assert_matches_reference(outputs[0], ref, f"{NAME}/roomy prompt {i}")
    # the same tokens when the pool preempts, by recompute and by swap
    swap = check_modes_agree(model, token_prompts, params, num_kv_blocks=24, max_num_seqs=12)
    assert swap.num_bytes_out == swap.num_blocks_out * 16 * 960
