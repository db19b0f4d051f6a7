"""Block tables as deltas: updates, the caller-side copy and its drift checks."""

from __future__ import annotations

import struct
import zlib

import pytest

from quire.block import (
    AdmitRequest,
    AppendRequest,
    BlockManager,
    BlockTables,
    ForkRequest,
    StepAllocation,
    StepAllocationResult,
    TableDriftError,
    TableUpdate,
    table_checksum,
)
from tests.libs.block.mirror import checked_step

BS = 4


def test_checksum_is_crc32_of_little_endian_uint32() -> None:
    assert table_checksum([1, 2, 70000]) == zlib.crc32(struct.pack("<3I", 1, 2, 70000))
    assert table_checksum([1, 2]) != table_checksum([2, 1])
    assert table_checksum([]) == 0


def test_decode_inside_a_block_sends_no_update() -> None:
    m = BlockManager(num_blocks=8, block_size=BS)
    checked_step(m, StepAllocation(admits=(AdmitRequest("a", (1, 2, 3, 4, 5)),)))
    result = checked_step(m, StepAllocation(appends=(AppendRequest("a", (6,)),)))
    assert result.table_updates == {}
    checked_step(m, StepAllocation(appends=(AppendRequest("a", (7, 8)),)))
    result = checked_step(m, StepAllocation(appends=(AppendRequest("a", (9,)),)))
    assert result.table_updates == {"a": TableUpdate(2, (2,))}


def test_copy_on_write_replaces_the_last_position() -> None:
    m = BlockManager(num_blocks=8, block_size=BS)
    checked_step(m, StepAllocation(admits=(AdmitRequest("a", (1, 2, 3, 4, 5)),)))
    result = checked_step(m, StepAllocation(forks=(ForkRequest("a", "b"),)))
    assert result.table_updates == {"b": TableUpdate(0, (0, 1))}
    result = checked_step(
        m, StepAllocation(appends=(AppendRequest("a", (6,)), AppendRequest("b", (7, 8, 9, 10))))
    )
    # a copies the shared block 1 into 2; b, the last owner, writes in place and grows.
    assert result.copies == [(1, 2)]
    assert result.table_updates == {"a": TableUpdate(1, (2,)), "b": TableUpdate(2, (3,))}


def _tables_with_a() -> tuple[BlockTables, StepAllocation]:
    tables = BlockTables(BS)
    admit = StepAllocation(admits=(AdmitRequest("a", (1, 2, 3, 4, 5)),))
    tables.apply(admit, StepAllocationResult(table_updates={"a": TableUpdate(0, (5, 6))}))
    return tables, StepAllocation(appends=(AppendRequest("a", (6,)),))


def test_an_update_past_the_end_is_drift() -> None:
    tables, step = _tables_with_a()
    lost = StepAllocationResult(table_updates={"a": TableUpdate(3, (9,))})
    with pytest.raises(TableDriftError, match="starts at 3, table has 2") as info:
        tables.apply(step, lost)
    assert info.value.seq_ids == ["a"]
    assert tables.get("a") == [5, 6]


def test_a_checksum_mismatch_is_drift_and_changes_nothing() -> None:
    tables, step = _tables_with_a()
    # The allocator's table is [5, 7] (copy-on-write of 6 -> 7), but the update was lost.
    lost = StepAllocationResult(table_checksums={"a": table_checksum([5, 7])})
    with pytest.raises(TableDriftError, match="checksum"):
        tables.apply(step, lost)
    assert tables.get("a") == [5, 6]
    ok = StepAllocationResult(
        table_updates={"a": TableUpdate(1, (7,))}, table_checksums={"a": table_checksum([5, 7])}
    )
    tables.apply(step, ok)
    assert tables.get("a") == [5, 7]


def test_a_lost_new_block_is_caught_by_length_in_the_same_step() -> None:
    tables, _ = _tables_with_a()
    # a goes from 5 to 9 tokens: 3 blocks; the update carrying the third was lost.
    step = StepAllocation(appends=(AppendRequest("a", (6, 7, 8, 9)),))
    with pytest.raises(TableDriftError, match="length"):
        tables.apply(step, StepAllocationResult())
    tables.apply(step, StepAllocationResult(table_updates={"a": TableUpdate(2, (8,))}))
    assert tables.get("a") == [5, 6, 8]


def test_frees_and_preemptions_drop_tables() -> None:
    tables, _ = _tables_with_a()
    tables.apply(StepAllocation(frees=("a",)), StepAllocationResult())
    assert "a" not in tables and len(tables) == 0
