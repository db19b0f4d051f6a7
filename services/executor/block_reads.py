"""Serving a peer's ReadBlocks: the blocks a memory manager pinned here, as bytes.

The pin keeps the blocks from being evicted or reused while the peer reads, and full,
committed blocks are never written again, so they are read from the KV tensors on the engine
thread between steps or while a step waits on a pull of its own (peer_reads). A pin only
protects anything if the manager that granted it is the one this executor is registered with
now (a restarted manager holds no pins), so a read naming another manager instance is refused,
as is one whose block layout differs.
"""

from __future__ import annotations

from quire.block.allocator import BlockAllocator
from quire.cache.block_transfer import block_bytes, checksum, layout
from quire.cache.paged_kv import PagedKVCache
from services.executor.remote_allocator import RemoteBlockAllocator
from services.rpc import executor_pb2 as pb


class ReadRefused(Exception):
    """The read cannot be served: `precondition` (pin or layout) or an invalid request."""

    def __init__(self, message: str, precondition: bool) -> None:
        super().__init__(message)
        self.precondition = precondition


def read_blocks(
    kv: PagedKVCache, allocator: BlockAllocator, request: pb.ReadBlocksRequest
) -> list[pb.BlockData]:
    """The requested blocks, one message each, in order; ReadRefused when it is not served."""
    registered = allocator.manager_instance if isinstance(allocator, RemoteBlockAllocator) else None
    if registered is None or request.granted_by != registered:
        raise ReadRefused(
            f"pin granted by {request.granted_by!r}, registered with {registered!r}", True
        )
    if request.layout != layout(kv):
        raise ReadRefused(f"layout {request.layout!r} is not this cache's {layout(kv)!r}", True)
    block_ids = list(request.block_ids)
    bad = [b for b in block_ids if not 0 <= b < kv.num_blocks]
    if bad:
        raise ReadRefused(f"block ids {bad[:8]} outside the pool's {kv.num_blocks}", False)
    return [
        pb.BlockData(index=index, data=data, crc32=checksum(data))
        for index, data in enumerate(block_bytes(kv.read_blocks(block_ids)))
    ]
