"""Preemption by swap over the memory manager: it preempts, the executor swaps, same tokens."""

from __future__ import annotations

import random
from pathlib import Path

from quire.block import BlockTables, TableLayout
from quire.config import EngineConfig
from quire.engine.llm_engine import LLMEngine
from quire.sampling_params import SamplingParams
from services.executor.remote_allocator import RemoteBlockAllocator
from tests.services.memory_manager.conftest import ManagerThread

TINY = Path(__file__).resolve().parents[3] / "models" / "quire-tiny"
LENGTHS = [15, 16, 17, 31, 32, 33, 47, 48, 64, 80, 96, 112]
MAX_TOKENS = [32, 48, 33, 31, 40, 32, 47, 48, 16, 32, 48, 64]


def run(engine: LLMEngine) -> dict[str, list[int]]:
    rng = random.Random(3)
    for i, (length, max_tokens) in enumerate(zip(LENGTHS, MAX_TOKENS, strict=True)):
        prompt = {"prompt_token_ids": [rng.randrange(3, 1000) for _ in range(length)]}
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        engine.add_request(f"r{i}", prompt, params)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step().outputs:
            for seq in output.outputs:
                tokens.setdefault(f"{output.request_id}/{seq.index}", []).extend(seq.new_token_ids)
    return tokens


def test_swap_over_remote_allocator_gives_the_tokens_of_no_preemption() -> None:
    assert (TINY / "config.json").is_file(), f"{TINY} is missing: `make model` builds it"
    roomy = EngineConfig(model=str(TINY), num_kv_blocks=512, dtype="float32", device="cpu")
    expected = run(LLMEngine(roomy))
    tight = EngineConfig(
        model=str(TINY),
        num_kv_blocks=24,
        max_num_seqs=12,
        dtype="float32",
        device="cpu",
        preemption_mode="swap",
    )
    manager = ManagerThread().start()

    def factory(num_blocks: int, tables: BlockTables, layout: TableLayout) -> RemoteBlockAllocator:
        return RemoteBlockAllocator(
            manager.target, "e1", 1, num_blocks, 16, True, "", tables, layout=layout
        )

    try:
        engine = LLMEngine(tight, allocator_factory=factory)
        allocator = engine.allocator
        assert isinstance(allocator, RemoteBlockAllocator)
        allocator.register()
        got = run(engine)
        stats = engine.stats()
        assert stats.num_preemptions > 0, "the manager was meant to preempt"
        assert stats.swap.num_blocks_in > 0, "no block was swapped back in"
        assert got == expected
        assert allocator.stats().num_blocks_used == 0
        allocator.close()
    finally:
        manager.stop()
