"""A memory manager told the model's sliding window (Register) releases blocks outside it: the
executor's tables, the manager's counts and the tokens agree with the in-process engine,
across a manager restart that rebuilds tables holding released slots. For a model whose
every layer slides (one table) and for a hybrid one (its KV groups' windows: a table entry per
group, the sliding groups' released)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from quire_tools.make_model import make_checkpoint

from quire.block import RELEASED_BLOCK, BlockTables, TableLayout
from quire.config import EngineConfig
from quire.engine.llm_engine import LLMEngine
from quire.sampling_params import SamplingParams
from services.executor.remote_allocator import RemoteBlockAllocator
from services.stack.ports import free_port
from tests.services.memory_manager.conftest import ManagerThread

BS = 8
WINDOW = 24  # tiny-mistral-window's, on every layer; tiny-gemma3's, on 3 of its 4 layers
# preset -> (KV groups, blocks in the pool)
MODELS = {"tiny-mistral-window": (1, 40), "tiny-gemma3": (4, 160)}
LENGTHS = [5, 40, 90, 17]
MAX_TOKENS = [40, 30, 36, 44]


@pytest.fixture(scope="module", params=list(MODELS))
def window_model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    return request.param, make_checkpoint(tmp_path_factory.mktemp("mw"), request.param, seed=8)


def run(engine: LLMEngine, after_step: Callable[[int], None] | None = None) -> list[list[int]]:
    rng = random.Random(3)
    vocab = engine.model.config.vocab_size
    for i, (n, m) in enumerate(zip(LENGTHS, MAX_TOKENS, strict=True)):
        prompt = [rng.randrange(3, vocab) for _ in range(n)]
        params = SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    tokens: list[list[int]] = [[] for _ in LENGTHS]
    num_steps = 0
    while engine.has_unfinished_requests():
        for delta in engine.step().outputs:
            tokens[int(delta.request_id)].extend(delta.outputs[0].new_token_ids)
        num_steps += 1
        if after_step is not None:
            after_step(num_steps)
    return tokens


def test_remote_allocator_releases_window_blocks_with_exact_accounting(
    window_model: tuple[str, Path],
) -> None:
    preset, path = window_model
    num_groups, num_blocks = MODELS[preset]
    config = EngineConfig(
        model=str(path),
        block_size=BS,
        num_kv_blocks=num_blocks,
        dtype="float32",
        device="cpu",
    )
    expected = run(LLMEngine(config))
    port = free_port()
    managers = [ManagerThread(port=port).start()]

    def factory(num_blocks: int, tables: BlockTables, layout: TableLayout) -> RemoteBlockAllocator:
        # the engine passes the window (every layer slides), or its KV groups' (a hybrid)
        assert layout.sliding_window == WINDOW and layout.num_groups == num_groups
        return RemoteBlockAllocator(
            managers[0].target,
            "e1",
            1,
            num_blocks,
            BS,
            True,
            "",
            tables,
            retry_total_s=20,
            verify_every=1,  # every step's tables checked against the manager's checksums
            layout=layout,
        )

    num_released: list[int] = []

    def check(num_steps: int) -> None:
        live = engine.runner.tables.live_sequences()
        present = {b for seq in live for b in seq.block_table if b != RELEASED_BLOCK}
        released = sum(seq.block_table.count(RELEASED_BLOCK) for seq in live)
        assert allocator.stats().num_blocks_used == len(present)
        num_released.append(released)
        if num_steps == 20:
            assert released > 0, "the restart was meant to rebuild released slots"
            managers[0].stop()  # the manager forgets everything; the executor re-registers
            managers.append(ManagerThread(port=port).start())

    try:
        engine = LLMEngine(config, allocator_factory=factory)
        allocator = engine.allocator
        assert isinstance(allocator, RemoteBlockAllocator)
        allocator.register()
        assert run(engine, check) == expected
        assert allocator.num_registrations == 2, "the restart was not noticed"
        assert max(num_released) >= 10
        assert allocator.stats().num_blocks_used == 0
    finally:
        managers[-1].stop()
