"""Which block allocator the engine uses: in-process, or a memory manager over gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from quire.block.allocator import BlockAllocator, StepAllocation
from quire.block.tables import BlockTables
from quire.block.window import TableLayout
from quire.cache.paged_kv import PagedKVCache
from quire.engine.llm_engine import AllocatorFactory
from quire.engine.scheduler import BlockPuller
from services.executor.block_puller import GrpcBlockPuller
from services.executor.executor_settings import LOCAL_MEMORY_MANAGER, ExecutorSettings
from services.executor.peer_reads import PeerReads
from services.executor.remote_allocator import AllocatorUnavailableError, RemoteBlockAllocator

log = structlog.get_logger("quire.executor.allocator")

StepMetadata = Callable[[StepAllocation], tuple[tuple[str, str], ...]]


def allocator_factory(
    settings: ExecutorSettings,
    executor_id: str,
    epoch: int,
    address: str,
    step_metadata: StepMetadata | None = None,
) -> AllocatorFactory | None:
    """A factory the engine calls once it has sized the pool; None for the in-process one.

    The engine passes its block tables, which the remote allocator re-registers from when
    its memory manager lost state (on the engine thread, inside a step).
    `step_metadata` gives the gRPC metadata of each Step call (the request ids it touches).
    """
    if settings.memory_manager == LOCAL_MEMORY_MANAGER:
        return None

    def make(num_blocks: int, tables: BlockTables, layout: TableLayout) -> BlockAllocator:
        return RemoteBlockAllocator(
            target=settings.memory_manager,
            executor_id=executor_id,
            epoch=epoch,
            num_blocks=num_blocks,
            block_size=settings.block_size,
            enable_prefix_caching=settings.enable_prefix_caching,
            address=address,
            tables=tables,
            timeout_s=settings.memory_manager_timeout_s,
            step_metadata=step_metadata,
            tls_ca=settings.tls_ca,
            verify_every=settings.memory_manager_verify_every,
            accepts_pulls=settings.enable_pulls,
            layout=layout,
            defer_quiet_steps=settings.defer_quiet_steps,
        )

    return make


def puller_factory(
    settings: ExecutorSettings, reads: PeerReads
) -> Callable[[PagedKVCache], BlockPuller] | None:
    """What copies peers' blocks into the engine's cache; None where nothing offers them (an
    in-process allocator) or pulls are off. A pull waiting for its blocks runs `reads`."""
    if settings.memory_manager == LOCAL_MEMORY_MANAGER or not settings.enable_pulls:
        return None

    def make(kv: PagedKVCache) -> BlockPuller:
        return GrpcBlockPuller(
            kv,
            settings.pull_timeout_s,
            settings.tls_ca,
            settings.pull_source_cooldown_s,
            while_waiting=reads.run_pending,
        )

    return make


async def register(
    allocator: BlockAllocator, should_stop: Callable[[], bool], max_backoff_s: float = 5.0
) -> bool:
    """Register with the memory manager, retrying while it is unreachable; False if told
    to stop first. Any other refusal (a bad configuration) raises.

    A manager that is not up yet is normal when a stack starts; the executor waits for it
    rather than crash-looping.
    """
    if not isinstance(allocator, RemoteBlockAllocator):
        return True
    backoff = 0.2
    while not should_stop():
        try:
            manager_id = await asyncio.to_thread(allocator.register)
            log.info("registered", manager_id=manager_id, num_blocks=allocator.num_blocks)
            return True
        except AllocatorUnavailableError as exc:
            log.warning("memory manager unreachable; retrying", error=str(exc))
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, max_backoff_s)
    return False


async def release(allocator: BlockAllocator) -> None:
    """Deregister (the manager drops our blocks and prefix entries) and close the channel."""
    if not isinstance(allocator, RemoteBlockAllocator):
        return
    try:
        await asyncio.to_thread(allocator.deregister)
        log.info("deregistered from the memory manager")
    except Exception as exc:
        log.warning("memory manager deregistration failed", error=str(exc))
    finally:
        allocator.close()


def is_recovering(allocator: BlockAllocator) -> bool:
    """Whether a step is waiting for an unreachable memory manager (never, in-process)."""
    return isinstance(allocator, RemoteBlockAllocator) and allocator.is_recovering
