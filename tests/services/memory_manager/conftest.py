"""Memory-manager test helpers: an in-process server on its own thread, an executor mirror."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from quire.block import BlockTables, LiveSequenceState, StepAllocation, StepAllocationResult
from services.executor.remote_allocator import RemoteBlockAllocator
from services.memory_manager.server import MemoryManagerServer
from services.memory_manager.settings import Settings

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


class ExecutorMirror:
    """What an executor knows of its sequences, updated from each step's result.

    `live_sequences()` is what a RemoteBlockAllocator re-registers with: the state
    as of the last completed step (never including the step in flight).
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.seqs: dict[str, LiveSequenceState] = {}

    def live_sequences(self) -> list[LiveSequenceState]:
        return list(self.seqs.values())

    def apply(
        self, step: StepAllocation, result: StepAllocationResult, tables: BlockTables
    ) -> None:
        """`tables`: the allocator's copy, with this step's updates applied."""
        for fork in step.forks:
            self.seqs[fork.child_seq_id] = self._with(
                self.seqs[fork.parent_seq_id], seq_id=fork.child_seq_id
            )
        for commit in step.commits:
            if commit.seq_id in self.seqs:  # the executor may have forgotten it already
                self.seqs[commit.seq_id] = self._with(
                    self.seqs[commit.seq_id], num_computed_tokens=commit.num_computed_tokens
                )
        for seq_id in step.frees:
            self.seqs.pop(seq_id, None)
        for seq_id in result.preempted:
            del self.seqs[seq_id]
        for append in step.appends:
            if append.seq_id in self.seqs:
                state = self.seqs[append.seq_id]
                self.seqs[append.seq_id] = self._with(
                    state, token_ids=state.token_ids + append.token_ids
                )
        for admit in step.admits:
            if admit.seq_id not in result.not_admitted:
                self.seqs[admit.seq_id] = LiveSequenceState(
                    admit.seq_id,
                    admit.token_ids,
                    (),
                    result.num_cached_tokens[admit.seq_id],
                    admit.extra_key,
                )
        for seq_id in result.table_updates:
            table = tables.get(seq_id)
            self.seqs[seq_id] = self._with(self.seqs[seq_id], block_table=tuple(table))

    @staticmethod
    def _with(state: LiveSequenceState, **changes: Any) -> LiveSequenceState:
        fields = {**state.__dict__, **changes}
        return LiveSequenceState(**fields)


class MirroredAllocator:
    """A RemoteBlockAllocator driven through an `ExecutorMirror` (an executor's view)."""

    def __init__(
        self,
        target: str,
        executor_id: str = "e1",
        epoch: int = 1,
        num_blocks: int = 8,
        block_size: int = 4,
        **kwargs: Any,
    ) -> None:
        self.mirror = ExecutorMirror(block_size)
        self.last_step = StepAllocation()
        self.allocator = RemoteBlockAllocator(
            target,
            executor_id,
            epoch,
            num_blocks,
            block_size,
            True,
            "127.0.0.1:1",
            self.mirror.live_sequences,
            **kwargs,
        )

    def step(self, **fields: Any) -> StepAllocationResult:
        step = StepAllocation(**fields)
        self.last_step = step
        result = self.allocator.step(step)
        self.mirror.apply(step, result, self.allocator.tables)
        return result

    def tables(self, *seq_ids: str) -> dict[str, list[int]]:
        """The executor's copy of these sequences' tables (built from the updates)."""
        return {seq_id: self.allocator.tables.get(seq_id) for seq_id in seq_ids}
