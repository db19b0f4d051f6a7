"""LLMEngine over RemoteBlockAllocator: same tokens as in-process, across a manager restart."""

from __future__ import annotations

from pathlib import Path

from quire.block import BlockTables, LiveSequenceState, TableLayout
from quire.config import EngineConfig
from quire.engine.llm_engine import LLMEngine
from quire.sampling_params import SamplingParams
from services.executor.remote_allocator import RemoteBlockAllocator
from services.stack.ports import free_port
from tests.services.memory_manager.conftest import ManagerThread, engine_tokens

TINY = Path(__file__).resolve().parents[3] / "models" / "quire-tiny"
PROMPTS = {
    "r0": "The paged cache keeps blocks",
    "r1": "The paged cache keeps blocks of keys and values",  # shares r0's prefix
    "r2": "Another prompt entirely",
}


def run(engine: LLMEngine, restart: object = None, at_step: int = 3) -> dict[str, list[int]]:
    params = {
        "r0": SamplingParams(temperature=0, max_tokens=12),
        "r1": SamplingParams(temperature=0, max_tokens=12, n=2, seed=1),
        "r2": SamplingParams(temperature=0.8, max_tokens=12, seed=7),
    }

    def after_step(num_steps: int) -> None:
        if num_steps == at_step and callable(restart):
            restart()

    requests = {request_id: (prompt, params[request_id]) for request_id, prompt in PROMPTS.items()}
    return engine_tokens(engine, requests, after_step)


def test_engine_over_remote_allocator_survives_manager_restart() -> None:
    assert (TINY / "config.json").is_file(), f"{TINY} is missing: `make model` builds it"
    config = EngineConfig(model=str(TINY), block_size=4, num_kv_blocks=48, device="cpu")
    expected = run(LLMEngine(config))

    port = free_port()
    managers = [ManagerThread(port=port).start()]
    num_live: list[int] = []

    def factory(num_blocks: int, tables: BlockTables, layout: TableLayout) -> RemoteBlockAllocator:
        live = tables.live_sequences

        def counted() -> list[LiveSequenceState]:  # what each re-registration sends
            states = live()
            num_live.append(len(states))
            return states

        tables.live_sequences = counted  # type: ignore[method-assign]
        return RemoteBlockAllocator(
            managers[0].target,
            "e1",
            1,
            num_blocks,
            4,
            True,
            "",
            tables,
            retry_total_s=20,
            layout=layout,
        )

    def restart() -> None:
        managers[0].stop()  # the manager forgets everything
        managers.append(ManagerThread(port=port).start())

    try:
        engine = LLMEngine(config, allocator_factory=factory)
        allocator = engine.allocator
        assert isinstance(allocator, RemoteBlockAllocator)
        allocator.register()
        got = run(engine, restart)
        assert allocator.num_registrations == 2, "the restart was not noticed"
        assert num_live[0] == 0 and num_live[1] >= 3  # r0, r1 (and its fork), r2 running
        assert got == expected
        stats = allocator.stats()
        assert stats.num_blocks_used == 0  # every sequence finished and was freed
        allocator.close()
    finally:
        for manager in managers:
            manager.stop()
