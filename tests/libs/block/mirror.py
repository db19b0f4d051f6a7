"""Steps checked against the pre-delta form: the updates, applied, give the full tables."""

from __future__ import annotations

import weakref
from dataclasses import replace

from quire.block import BlockManager, BlockTables, StepAllocation, StepAllocationResult

_MIRRORS: weakref.WeakKeyDictionary[BlockManager, BlockTables] = weakref.WeakKeyDictionary()


def mirror_of(manager: BlockManager) -> BlockTables:
    """The caller-side copy of `manager`'s tables (seeded from its live tables on first use)."""
    tables = _MIRRORS.get(manager)
    if tables is None:
        tables = BlockTables(manager.block_size)
        tables.reset(manager.live_sequences())
        _MIRRORS[manager] = tables
    return tables


def checked_step(manager: BlockManager, request: StepAllocation) -> StepAllocationResult:
    """`manager.step(request)` with checksums and full tables, after checking that the
    table updates applied to the caller's copy give every live table exactly."""
    tables = mirror_of(manager)
    result = manager.step(replace(request, verify_tables=True, full_tables=True))
    tables.apply(request, result)  # raises TableDriftError on a checksum mismatch
    for seq_id, table in result.block_tables.items():
        assert tables.get(seq_id) == table, f"{seq_id}: deltas {tables.get(seq_id)} != {table}"
    live = {seq_id: manager.block_table(seq_id) for seq_id in manager.seq_ids()}
    assert {seq_id: tables.get(seq_id) for seq_id in live} == live
    assert len(tables) == len(live), "the copy holds tables of sequences that are gone"
    return result
