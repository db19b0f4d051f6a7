"""What the executor relies on: `allocator_factory`, and the runner's tables as live state."""

from __future__ import annotations

from pathlib import Path

import pytest

from quire.block import BlockManager
from quire.block.allocator import BlockAllocator
from quire.block.restore import validate_live_sequences
from quire.block.tables import BlockTables
from quire.config import EngineConfig
from quire.engine.llm_engine import LLMEngine
from quire.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine_and_sizes(tiny_model: Path) -> tuple[LLMEngine, list[int]]:
    sizes: list[int] = []
    given: list[BlockTables] = []

    def factory(num_blocks: int, tables: BlockTables, window: int | None) -> BlockAllocator:
        sizes.append(num_blocks)
        given.append(tables)
        return BlockManager(num_blocks, 16, True)

    config = EngineConfig(model=str(tiny_model), max_num_seqs=4, max_model_len=256)
    engine = LLMEngine(config, allocator_factory=factory)
    # The factory gets the one record of the block tables: the runner's, the scheduler's.
    assert given == [engine.runner.tables] and engine.scheduler.tables is engine.runner.tables
    return engine, sizes


def test_factory_gets_the_engine_sized_pool(engine_and_sizes: tuple[LLMEngine, list[int]]) -> None:
    engine, sizes = engine_and_sizes
    # num_kv_blocks=None: sized from memory, capped at max_num_seqs full-length sequences.
    assert sizes == [4 * 256 // 16]
    assert engine.allocator.num_blocks == sizes[0]
    assert engine.runner.kv_caches[0][0].shape[0] == sizes[0]


def test_allocator_and_factory_together_are_refused(tiny_model: Path) -> None:
    config = EngineConfig(model=str(tiny_model), num_kv_blocks=8)
    with pytest.raises(ValueError, match="not both"):
        LLMEngine(
            config,
            BlockManager(8, 16, True),
            allocator_factory=lambda n, _t, _w: BlockManager(n, 16),
        )


def test_live_sequences_describe_a_consistent_pool(
    engine_and_sizes: tuple[LLMEngine, list[int]],
) -> None:
    engine, _ = engine_and_sizes
    tables = engine.runner.tables
    prompt = list(range(10, 50))
    params = SamplingParams(n=2, temperature=0.0, max_tokens=30, ignore_eos=True)
    engine.add_request("live", {"prompt_token_ids": prompt}, params)
    assert tables.live_sequences() == []  # waiting, nothing granted yet
    for _ in range(3):
        engine.step()
    live = tables.live_sequences()
    assert sorted(s.seq_id for s in live) == ["live#0", "live#1"]
    for state in live:
        assert state.token_ids[: len(prompt)] == tuple(prompt)
        assert state.extra_key == "quire-tiny"
        assert 0 < state.num_computed_tokens <= len(state.token_ids)
    validate_live_sequences(live, engine.allocator.num_blocks, engine.config.block_size)
    engine.abort_request("live")
    assert tables.live_sequences() == []
