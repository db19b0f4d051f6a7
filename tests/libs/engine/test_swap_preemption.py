"""Preemption by swap gives the tokens of preemption by recompute and of no preemption at all.

Every case runs the same requests three times on float32 quire-tiny (grouped-query attention:
4 query heads over 2 KV heads): with a pool large enough that nothing is preempted, then with
a pool that preempts, once per preemption mode. Each asserts that the pool did preempt and that
swapping did load blocks back, so none can pass without exercising what it tests.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from quire import LLM, SamplingParams
from quire.engine.stats import SwapStats

# Lengths at, just below and just above block boundaries (block size 16).
BOUNDARY_LENGTHS = [15, 16, 17, 31, 32, 33, 47, 48, 64, 80, 96, 112]
BOUNDARY_MAX_TOKENS = [32, 48, 33, 31, 40, 32, 47, 48, 16, 32, 48, 64]
CHUNKED_LENGTHS = [100, 64, 90, 33, 120, 70, 48, 81]
CHUNKED_MAX_TOKENS = [60, 50, 66, 40, 50, 58, 62, 56]


def prompts(vocab_size: int, lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]


def run(
    model: Path, token_prompts: list[list[int]], params: list[SamplingParams], **engine: Any
) -> tuple[list[list[list[int]]], int, SwapStats]:
    """Every output's tokens per request, the preemptions and the swap totals."""
    llm = LLM(model=str(model), dtype="float32", **engine)
    outputs = llm.generate([{"prompt_token_ids": p} for p in token_prompts], params, use_tqdm=False)
    stats = llm.stats()
    assert stats.allocator.num_blocks_used == 0, "blocks leaked after generate()"
    return (
        [[o.token_ids for o in out.outputs] for out in outputs],
        stats.num_preemptions,
        stats.swap,
    )


def check_modes_agree(
    model: Path, token_prompts: list[list[int]], params: list[SamplingParams], **tight: Any
) -> SwapStats:
    """Roomy pool, recompute and swap give the same tokens; returns swap mode's totals."""
    roomy = {k: v for k, v in tight.items() if k not in ("num_kv_blocks", "swap_space")}
    expected, num_preemptions, _ = run(model, token_prompts, params, **roomy, num_kv_blocks=512)
    assert num_preemptions == 0, "the roomy pool was meant to hold everything"
    recomputed, num_preemptions, swap = run(
        model, token_prompts, params, **tight, preemption_mode="recompute"
    )
    assert num_preemptions > 0, "the tight pool was meant to preempt"
    assert swap.num_blocks_out == swap.num_blocks_in == 0 and swap.host_bytes_capacity == 0
    assert recomputed == expected
    swapped, num_preemptions, swap = run(
        model, token_prompts, params, **tight, preemption_mode="swap"
    )
    assert num_preemptions > 0
    assert swap.num_blocks_in > 0, "no block was loaded back: swapping was not exercised"
    assert swap.num_bytes_in == swap.num_blocks_in * swap.num_bytes_out // swap.num_blocks_out
    assert swapped == expected
    return swap


def greedy(max_tokens: list[int]) -> list[SamplingParams]:
    return [SamplingParams(temperature=0, max_tokens=m) for m in max_tokens]


def test_at_block_boundaries(tiny_model: Path) -> None:
    token_prompts = prompts(1000, BOUNDARY_LENGTHS, seed=3)
    # Outputs of 16, 32 and 48 tokens end sequences exactly at block boundaries too.
    params = greedy(BOUNDARY_MAX_TOKENS)
    swap = check_modes_agree(tiny_model, token_prompts, params, num_kv_blocks=24, max_num_seqs=12)
    assert swap.host_bytes_used > 0


def test_under_chunked_prefill(tiny_model: Path) -> None:
    # 24-token steps chunk every prompt longer than that, resumed ones included.
    token_prompts = prompts(1000, CHUNKED_LENGTHS, seed=5)
    params = greedy(CHUNKED_MAX_TOKENS)
    check_modes_agree(
        tiny_model,
        token_prompts,
        params,
        num_kv_blocks=24,
        max_num_seqs=8,
        max_num_batched_tokens=24,
    )


def test_forks_with_copy_on_write(tiny_model: Path) -> None:
    # n > 1: the outputs share their prompt's blocks (the partial one copied on first write);
    # a preempted output swaps shared blocks under one hash.
    token_prompts = prompts(1000, [40, 57, 33, 70, 20], seed=9)
    params = [
        SamplingParams(temperature=0.9, n=3, seed=11, max_tokens=30),
        SamplingParams(temperature=0, max_tokens=28),
        SamplingParams(temperature=0.7, n=2, seed=12, max_tokens=34),
        SamplingParams(temperature=0, max_tokens=22),
        SamplingParams(temperature=1.0, n=4, seed=13, max_tokens=26),
    ]
    check_modes_agree(tiny_model, token_prompts, params, num_kv_blocks=24, max_num_seqs=16)


def test_a_small_host_pool_evicts_and_the_rest_is_recomputed(tiny_model: Path) -> None:
    # Room for 3 blocks of quire-tiny's KV: resumes find some of their blocks and miss others.
    token_prompts = prompts(1000, CHUNKED_LENGTHS, seed=3)
    llm = LLM(model=str(tiny_model), dtype="float32", num_kv_blocks=4)
    three_blocks = 3 * llm.engine.runner.kv.bytes_per_block / (1 << 30)
    del llm
    swap = check_modes_agree(
        tiny_model,
        token_prompts,
        greedy(CHUNKED_MAX_TOKENS),
        num_kv_blocks=24,
        max_num_seqs=12,
        swap_space=three_blocks,
    )
    assert swap.num_blocks_missed > 0
    assert swap.host_bytes_used == swap.host_bytes_capacity


def test_swap_space_zero_recomputes(tiny_model: Path) -> None:
    token_prompts = prompts(1000, BOUNDARY_LENGTHS, seed=3)
    params = greedy(BOUNDARY_MAX_TOKENS)
    _, num_preemptions, swap = run(
        tiny_model,
        token_prompts,
        params,
        num_kv_blocks=24,
        max_num_seqs=12,
        preemption_mode="swap",
        swap_space=0.0,
    )
    assert num_preemptions > 0
    assert swap == SwapStats(0, 0, 0, 0, 0, 0, 0)
