"""Steps checked against whole tables: the updates, applied, give every live table exactly."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace

from quire.block import BlockManager, BlockTables, StepAllocation, StepAllocationResult
from quire.block.tables import named_seq_ids

_MIRRORS: weakref.WeakKeyDictionary[BlockManager, BlockTables] = weakref.WeakKeyDictionary()


@dataclass
class CheckedResult(StepAllocationResult):
    """A step's result, plus the whole table of every sequence the step names."""

    block_tables: dict[str, list[int]] = field(default_factory=dict)


def mirror_of(manager: BlockManager) -> BlockTables:
    """The caller-side tables of `manager` (seeded from its live sequences on first use)."""
    tables = _MIRRORS.get(manager)
    if tables is None:
        tables = BlockTables(manager.block_size, manager.num_groups)
        tables.reset(manager.live_sequences())
        _MIRRORS[manager] = tables
    return tables


def checked_step(manager: BlockManager, request: StepAllocation) -> CheckedResult:
    """`manager.step(request)` with checksums, after checking that the table updates
    applied to the caller's tables give every live table exactly; with the whole tables
    of the sequences it names."""
    tables = mirror_of(manager)
    result = manager.step(replace(request, verify_tables=True))
    tables.apply(request, result)  # raises TableDriftError on a checksum mismatch
    live = {seq_id: manager.block_table(seq_id) for seq_id in manager.seq_ids()}
    assert {seq_id: tables.get(seq_id) for seq_id in live} == live
    assert len(tables) == len(live), "the copy holds tables of sequences that are gone"
    named = {seq_id: live[seq_id] for seq_id in named_seq_ids(request, result)}
    return CheckedResult(**vars(result), block_tables=named)
