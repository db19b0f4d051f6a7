"""Block tables as deltas: updates, the caller-side copy and its drift checks."""

from __future__ import annotations

import struct
import zlib
from dataclasses import replace

import pytest

from quire.block import (
    AdmitRequest,
    AllocatorStats,
    AppendRequest,
    BlockManager,
    BlockTables,
    CommitRequest,
    ForkRequest,
    LiveSequenceState,
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


def test_free_slots_are_the_rest_of_the_last_block_in_each_group() -> None:
    tables = BlockTables(BS)
    tables.apply(
        StepAllocation(admits=(AdmitRequest("a", (1, 2, 3, 4, 5)),)),
        StepAllocationResult(table_updates={"a": TableUpdate(0, (7, 9))}),
    )
    assert tables.free_slots("a") == 3  # two blocks of 4 slots, 5 tokens
    grouped = BlockTables(BS, num_groups=2)  # a table entry per group and logical block
    grouped.apply(
        StepAllocation(admits=(AdmitRequest("a", (1, 2, 3, 4, 5, 6)),)),
        StepAllocationResult(table_updates={"a": TableUpdate(0, (7, 8, 9, 10))}),
    )
    assert grouped.free_slots("a") == 2


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


def test_live_sequences_are_what_the_allocator_granted() -> None:
    manager = BlockManager(num_blocks=16, block_size=BS)
    tables = BlockTables(BS)
    tables.step(manager, StepAllocation(admits=(AdmitRequest("a", (1, 2, 3, 4, 5), "m"),)))
    # a's first full block is committed; b is forked from a and both decode a token.
    tables.step(
        manager,
        StepAllocation(forks=(ForkRequest("a", "b"),), commits=(CommitRequest("a", 5),)),
    )
    tables.step(
        manager, StepAllocation(appends=(AppendRequest("a", (6,)), AppendRequest("b", (7,))))
    )
    # c repeats a's first block: a prefix hit, committed as it is admitted.
    tables.step(manager, StepAllocation(admits=(AdmitRequest("c", (1, 2, 3, 4, 9), "m"),)))
    live = {s.seq_id: s for s in tables.live_sequences()}

    def full_blocks(state: LiveSequenceState) -> LiveSequenceState:
        # The manager counts committed tokens in whole registered blocks.
        return replace(state, num_computed_tokens=state.num_computed_tokens // BS * BS)

    assert {k: full_blocks(s) for k, s in live.items()} == {
        s.seq_id: s for s in manager.live_sequences()
    }
    assert live["a"].token_ids == (1, 2, 3, 4, 5, 6) and live["b"].token_ids[-1] == 7
    assert live["c"].num_computed_tokens == BS  # the hit, as granted
    assert {s.extra_key for s in live.values()} == {"m"}
    tables.step(manager, StepAllocation(frees=("a", "b", "c")))
    assert tables.live_sequences() == [] and manager.live_sequences() == []


class _DroppingAllocator:
    """A BlockManager whose first `drops` steps lose their table updates, as do its
    resyncs unless it `heals`."""

    block_size = BS
    num_blocks = 16

    def __init__(self, heals: bool) -> None:
        self.inner = BlockManager(self.num_blocks, BS)
        self.heals, self.drops = heals, 0
        self.resyncs: list[str] = []
        self.live_before: list[LiveSequenceState] = []

    def step(self, request: StepAllocation) -> StepAllocationResult:
        result = self.inner.step(request)
        if self.drops:
            self.drops -= 1
            result.table_updates = {}
        return result

    def resync(self, request: StepAllocation, reason: str) -> StepAllocationResult:
        # What a memory manager does: rebuild from the caller's live state, redo the step.
        self.resyncs.append(reason)
        assert request.verify_tables
        self.inner = BlockManager(self.num_blocks, BS)
        self.inner.restore(self.live_before)
        result = self.inner.step(request)
        if not self.heals:
            result.table_updates = {}
        return result

    def stats(self) -> AllocatorStats:
        return self.inner.stats()


def test_step_resyncs_on_drift_and_raises_when_it_persists() -> None:
    for heals in (True, False):
        allocator = _DroppingAllocator(heals)
        tables = BlockTables(BS)
        tables.step(allocator, StepAllocation(admits=(AdmitRequest("a", (1, 2, 3, 4, 5)),)))
        allocator.drops = 1
        allocator.live_before = tables.live_sequences()
        step = StepAllocation(appends=(AppendRequest("a", (6, 7, 8, 9)),))
        if heals:
            result = tables.step(allocator, step)
            assert len(allocator.resyncs) == 1 and "length" in allocator.resyncs[0]
            assert tables.get("a") == allocator.inner.block_table("a")
            assert len(tables.get("a")) == 3 and "a" in result.table_updates
        else:
            with pytest.raises(TableDriftError, match="again after a resync"):
                tables.step(allocator, step)
            assert tables.get("a") == [0, 1]  # the failed step changed nothing


def test_the_in_process_allocator_refuses_to_resync() -> None:
    with pytest.raises(RuntimeError, match="disagree with the in-process allocator"):
        BlockManager(num_blocks=4, block_size=BS).resync(StepAllocation(), "checksum mismatch")
