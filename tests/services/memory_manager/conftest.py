"""Memory-manager test helpers: an in-process server on its own thread, an executor mirror,
an engine run to the end."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from quire.block import BlockTables, StepAllocation, StepAllocationResult
from quire.engine.llm_engine import LLMEngine
from quire.sampling_params import SamplingParams
from services.executor.remote_allocator import RemoteBlockAllocator
from services.memory_manager.manager_server import MemoryManagerServer
from services.memory_manager.manager_settings import Settings

T = TypeVar("T")


class ManagerThread:
    """A `MemoryManagerServer` serving from an event loop on a daemon thread."""

    def __init__(self, **settings: Any) -> None:
        self.settings = Settings(**{"port": 0, "redis_url": "", **settings})
        self.server = MemoryManagerServer(self.settings)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def start(self) -> ManagerThread:
        self.thread.start()
        self.call(self.server.start())
        return self

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 10.0) -> T:
        """Run `coro` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        self.call(self.server.stop(grace_s=0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


@pytest.fixture
def manager() -> Iterator[ManagerThread]:
    """An in-process memory manager without Redis."""
    thread = ManagerThread().start()
    yield thread
    thread.stop()


class MirroredAllocator:
    """A RemoteBlockAllocator driven the way an executor drives it: every step through the
    executor's `BlockTables`, which the allocator re-registers from."""

    def __init__(
        self,
        target: str,
        executor_id: str = "e1",
        epoch: int = 1,
        num_blocks: int = 8,
        block_size: int = 4,
        **kwargs: Any,
    ) -> None:
        self.block_tables = BlockTables(block_size)
        self.last_step = StepAllocation()
        self.allocator = RemoteBlockAllocator(
            target,
            executor_id,
            epoch,
            num_blocks,
            block_size,
            True,
            "127.0.0.1:1",
            self.block_tables,
            **kwargs,
        )

    def step(self, **fields: Any) -> StepAllocationResult:
        step = StepAllocation(**fields)
        self.last_step = step
        return self.block_tables.step(self.allocator, step)

    def tables(self, *seq_ids: str) -> dict[str, list[int]]:
        """The executor's copy of these sequences' tables (built from the updates)."""
        return {seq_id: self.block_tables.get(seq_id) for seq_id in seq_ids}


def engine_tokens(
    engine: LLMEngine,
    requests: dict[str, tuple[str, SamplingParams]],
    after_step: Callable[[int], None] | None = None,
) -> dict[str, list[int]]:
    """Run `requests` (id -> prompt, params) to the end; every output's tokens by
    "request_id/index". `after_step(n)` runs after the engine's n-th step."""
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    tokens: dict[str, list[int]] = {}
    num_steps = 0
    while engine.has_unfinished_requests():
        for output in engine.step().outputs:
            for seq in output.outputs:
                tokens.setdefault(f"{output.request_id}/{seq.index}", []).extend(seq.new_token_ids)
        num_steps += 1
        if after_step is not None:
            after_step(num_steps)
    return tokens
