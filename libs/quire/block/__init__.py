"""Paged KV block management: chained block hashes, the block pool and the step allocator."""

from __future__ import annotations

from quire.block.allocator import (
    AdmitRequest,
    AllocatorStats,
    AppendRequest,
    BlockAllocator,
    CommitRequest,
    ForkRequest,
    StepAllocation,
    StepAllocationResult,
    TableUpdate,
)
from quire.block.hashing import (
    HASH_SIZE,
    extend_block_hashes,
    group_block_hash,
    hash_block,
    hash_full_blocks,
)
from quire.block.manager import BlockManager, LocalBlockAllocator
from quire.block.pool import BlockPool, BlockState
from quire.block.restore import LiveSequenceState
from quire.block.tables import BlockTables, TableDriftError, table_checksum
from quire.block.window import RELEASED_BLOCK, TableLayout, first_needed_block

__all__ = [
    "HASH_SIZE",
    "RELEASED_BLOCK",
    "AdmitRequest",
    "AllocatorStats",
    "AppendRequest",
    "BlockAllocator",
    "BlockManager",
    "BlockPool",
    "BlockState",
    "BlockTables",
    "CommitRequest",
    "ForkRequest",
    "LiveSequenceState",
    "LocalBlockAllocator",
    "StepAllocation",
    "StepAllocationResult",
    "TableDriftError",
    "TableLayout",
    "TableUpdate",
    "extend_block_hashes",
    "first_needed_block",
    "group_block_hash",
    "hash_block",
    "hash_full_blocks",
    "table_checksum",
]
