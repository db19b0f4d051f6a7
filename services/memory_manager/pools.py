"""The executors registered with this manager: one `BlockManager` per executor incarnation.

No gRPC here: misuse raises ValueError (invalid request), `UnknownExecutorError`
or `StaleEpochError`, and the servicer maps those to status codes.

Epochs order an executor's incarnations (a new one per process start, increasing,
e.g. the start time in nanoseconds). Register with the current or a newer epoch
replaces the executor's state with the one rebuilt from its live sequences; an
older epoch is refused, so a zombie process cannot take its successor's pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from quire.block.manager import BlockManager
from quire.block.restore import LiveSequenceState
from quire.block.window import TableLayout
from services.common.epochs import StaleEpochError


class UnknownExecutorError(LookupError):
    """No executor with that id is registered here."""


@dataclass
class ExecutorPool:
    """One registered executor incarnation and its block manager."""

    executor_id: str
    epoch: int
    address: str  # host:port where routers reach the executor
    manager: BlockManager
    # Whether the executor copies peers' blocks when offered (PullOffer in its steps).
    accepts_pulls: bool = False


class ExecutorPools:
    """executor id -> `ExecutorPool`, for every executor registered with this manager."""

    def __init__(self) -> None:
        self._pools: dict[str, ExecutorPool] = {}

    def __iter__(self) -> Iterator[ExecutorPool]:
        return iter(list(self._pools.values()))

    def __len__(self) -> int:
        return len(self._pools)

    def register(
        self,
        executor_id: str,
        epoch: int,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        address: str,
        live: list[LiveSequenceState],
        accepts_pulls: bool = False,
        sliding_window: int | None = None,
        group_windows: tuple[int | None, ...] = (),
    ) -> tuple[ExecutorPool, ExecutorPool | None]:
        """Create (or replace) the executor's pool, rebuilt from `live`; with
        `sliding_window`, it releases blocks outside every layer's window (quire.block.window);
        with `group_windows` (a window per KV group, None for a global one), its tables hold
        every group's entry of each logical block and only the sliding groups' are released
        (pulls pair it only with pools of the same groups).

        Returns the new pool and the one it replaced. Nothing changes on error.
        """
        if not executor_id:
            raise ValueError("executor_id: must be non-empty")
        if num_blocks < 1:
            raise ValueError(f"num_blocks: must be >= 1, got {num_blocks}")
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"block_size: must be a power of two, got {block_size}")
        old = self._pools.get(executor_id)
        if old is not None and epoch < old.epoch:
            raise StaleEpochError(
                f"executor {executor_id!r}: epoch {epoch} is older than "
                f"the registered epoch {old.epoch}"
            )
        layout = TableLayout(group_windows) if group_windows else None
        manager = BlockManager(
            num_blocks, block_size, enable_prefix_caching, sliding_window, layout=layout
        )
        manager.restore(live)  # ValueError: the old state stays
        pool = ExecutorPool(executor_id, epoch, address, manager, accepts_pulls)
        self._pools[executor_id] = pool
        return pool, old

    def get(self, executor_id: str, epoch: int) -> ExecutorPool:
        """The pool of that exact incarnation."""
        pool = self._pools.get(executor_id)
        if pool is None:
            raise UnknownExecutorError(f"executor not registered: {executor_id!r}")
        if pool.epoch != epoch:
            raise StaleEpochError(
                f"executor {executor_id!r}: epoch {epoch} is not the registered epoch {pool.epoch}"
            )
        return pool

    def find(self, executor_id: str) -> ExecutorPool | None:
        """The executor's pool, whatever its epoch; None if unknown."""
        return self._pools.get(executor_id)

    def deregister(self, executor_id: str, epoch: int) -> ExecutorPool | None:
        """Drop the incarnation's pool; None if the executor is unknown (nothing to do)."""
        pool = self._pools.get(executor_id)
        if pool is None:
            return None
        if pool.epoch != epoch:
            raise StaleEpochError(
                f"executor {executor_id!r}: epoch {epoch} is not the registered epoch {pool.epoch}"
            )
        del self._pools[executor_id]
        return pool
