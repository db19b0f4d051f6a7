"""A hybrid model's flat tables (one entry per KV group per logical block): the sliding groups'
entries outside the window are released, the global groups' kept; exact ids and counts."""

from __future__ import annotations

import pytest

from quire.block import (
    RELEASED_BLOCK,
    BlockManager,
    BlockTables,
    ForkRequest,
    StepAllocation,
    TableLayout,
    TableUpdate,
    group_block_hash,
    hash_full_blocks,
)
from tests.libs.block.steps import admit, append, commit, refcounts, run

BS = 16
WINDOW = 32  # a decoding sequence's sliding groups hold at most WINDOW // BS + 1 = 3 blocks each
R = RELEASED_BLOCK
HYBRID = TableLayout((None, WINDOW))  # Gemma 2 / gpt-oss: one global group, one sliding
GEMMA3 = TableLayout((None, WINDOW, WINDOW))  # one global group, two sliding


def held(m: BlockManager, seq_id: str, group: int) -> int:
    """Blocks group `group` of the sequence's table holds (released slots left out)."""
    return sum(b != R for b in m.layout.group_table(m.block_table(seq_id), group))


def decode(m: BlockManager, seq_id: str, num_steps: int) -> list[int]:
    """`num_steps` decode steps (commit every token so far, append one); the most blocks each
    group held at once."""
    most = [0] * m.num_groups
    for i in range(num_steps):
        run(
            m,
            commits=(commit(seq_id, m.num_tokens(seq_id)),),
            appends=(append(seq_id, [i % 50]),),
        )
        most = [max(most[g], held(m, seq_id, g)) for g in range(m.num_groups)]
    return most


def test_a_table_interleaves_the_groups_and_releases_only_the_sliding_column() -> None:
    m = BlockManager(num_blocks=40, block_size=BS, layout=HYBRID)
    result = run(m, admits=(admit("a", list(range(50))),))  # 4 logical blocks, 8 entries
    assert result.block_tables == {"a": [0, 1, 2, 3, 4, 5, 6, 7]}
    # c = 50: the next token reads 19 .. 50, so logical block 0's sliding entry goes
    result = run(m, commits=(commit("a", 50),))
    assert result.table_updates == {"a": TableUpdate(1, (R, 2, 3, 4, 5, 6, 7))}
    assert m.block_table("a") == [0, R, 2, 3, 4, 5, 6, 7]
    assert refcounts(m)[:8] == [1, 0, 1, 1, 1, 1, 1, 1]
    # the released block keeps its (group 1) hash: cached, not lost
    first = hash_full_blocks(list(range(50)), BS)[0]
    assert m.pool.block_hash(1) == group_block_hash(first, 1) != first
    assert m.pool.block_hash(0) == first


@pytest.mark.parametrize("layout", [HYBRID, GEMMA3], ids=["gemma2", "gemma3"])
def test_decoding_sliding_groups_hold_the_window_plus_one_block_global_ones_all(
    layout: TableLayout,
) -> None:
    m = BlockManager(num_blocks=200, block_size=BS, layout=layout)
    run(m, admits=(admit("a", list(range(20))),))
    most = decode(m, "a", 150)  # 170 tokens: 11 logical blocks
    assert most[0] == 11  # the global group reads every block
    assert most[1:] == [WINDOW // BS + 1] * (layout.num_groups - 1)
    used = m.stats().num_blocks_used
    assert used == 11 + (layout.num_groups - 1) * sum(
        b != R for b in m.layout.group_table(m.block_table("a"), 1)
    )
    run(m, frees=("a",))
    assert m.stats().num_blocks_used == 0


def _hit_after_pressure(num_pressure_blocks: int) -> tuple[list[list[bool]], int, list[int]]:
    """A 64-token prompt computed and freed (its sliding entries of blocks 0 and 1 released at
    its commit, the rest at its end), then another prompt of `num_pressure_blocks` blocks
    admitted and freed (evicting the least recently used cached blocks), then the first prompt
    plus one token again: which group blocks were still indexed, the tokens the hit covered
    and the new table."""
    m = BlockManager(num_blocks=22, block_size=BS, layout=HYBRID)
    prompt = list(range(64))
    run(m, admits=(admit("a", prompt),))
    run(m, commits=(commit("a", 64),))
    run(m, frees=("a",))
    if num_pressure_blocks:
        run(m, admits=(admit("c", list(range(500, 500 + 16 * num_pressure_blocks))),))
        run(m, frees=("c",))
    hashes = hash_full_blocks(prompt, BS)
    indexed = [
        [m.pool.lookup(group_block_hash(h, g)) is not None for g in range(2)] for h in hashes
    ]
    result = run(m, admits=(admit("b", prompt + [7]),))
    return indexed, result.num_cached_tokens["b"], m.block_table("b")


def test_a_prefix_hit_takes_the_global_blocks_and_the_sliding_ones_its_window_reads() -> None:
    # Nothing evicted: 4 blocks hit; the next token (64) reads 33 .. 64, so the sliding
    # group's blocks 0 and 1 are left out of the table (released), though still cached.
    indexed, cached, table = _hit_after_pressure(0)
    assert all(all(groups) for groups in indexed)
    assert cached == 64 and table[:8] == [0, R, 2, R, 4, 5, 6, 7]
    # 16 of 22 blocks taken, 14 never used: the two least recently used cached ones, blocks
    # 0 and 1's sliding entries (released first), are evicted; the hit does not need them
    indexed, cached, table = _hit_after_pressure(8)
    assert indexed == [[True, False], [True, False], [True, True], [True, True]]
    assert cached == 64 and table[:8] == [0, R, 2, R, 4, 5, 6, 7]
    # 18 taken: block 3's entries are gone too. A hit of 4 blocks needs them, of 3 blocks
    # block 1's sliding one, of 2 or 1 block block 0's: nothing is hit
    indexed, cached, table = _hit_after_pressure(9)
    assert indexed == [[True, False], [True, False], [True, True], [False, False]]
    assert cached == 0 and R not in table


def test_copy_on_write_copies_each_group_s_shared_partial_block() -> None:
    m = BlockManager(num_blocks=20, block_size=BS, layout=HYBRID)
    run(m, admits=(admit("a", list(range(20))),))  # entries 0..3, logical block 1 partial
    run(m, commits=(commit("a", 20),))
    run(m, forks=(ForkRequest("a", "b"),))
    result = run(m, appends=(append("a", [1]), append("b", [2])))
    assert sorted(result.copies) == [(2, 4), (3, 5)]
    assert m.block_table("a") == [0, 1, 4, 5] and m.block_table("b") == [0, 1, 2, 3]
    assert result.table_updates == {"a": TableUpdate(2, (4, 5))}


def test_preemption_counts_every_group_s_entries() -> None:
    m = BlockManager(num_blocks=8, block_size=BS, layout=HYBRID)
    run(m, admits=(admit("a", list(range(16))), admit("b", list(range(100, 116)))))
    assert m.num_free_blocks == 4
    # a's 33 tokens take two more logical blocks: 4 entries, every free one
    result = run(m, appends=(append("a", list(range(17))), append("b")))
    assert result.preempted == [] and m.num_free_blocks == 0
    # b's 17th token needs a logical block (2 entries): b, the latest, is preempted
    result = run(m, appends=(append("a", [5]), append("b", list(range(16)))))
    assert result.preempted == ["b"] and m.num_free_blocks == 2
    run(m, frees=("a",))
    assert m.stats().num_blocks_used == 0


def test_restore_takes_a_flat_table_back() -> None:
    m = BlockManager(num_blocks=20, block_size=BS, layout=GEMMA3)
    run(m, admits=(admit("a", list(range(70))),))
    run(m, commits=(commit("a", 64),))
    table = m.block_table("a")
    assert m.layout.group_table(table, 0) == [0, 3, 6, 9, 12]
    assert m.layout.group_table(table, 1) == [R, R, 7, 10, 13]
    live = BlockTables(BS, 3)
    live.reset(m.live_sequences())
    restored = BlockManager(num_blocks=20, block_size=BS, layout=GEMMA3)
    restored.restore(live.live_sequences())
    restored.check_integrity()
    assert restored.block_table("a") == table
    assert refcounts(restored) == refcounts(m)
    step = StepAllocation(commits=(commit("a", 70),), appends=(append("a", list(range(11))),))
    # a restored pool's free blocks go in id order: the released ones first
    assert restored.step(step).table_updates == {"a": TableUpdate(15, (1, 2, 4))}
    restored.check_integrity()
    # a table with a released global entry, or of the plain length, is refused
    bad = [live.live_sequences()[0]]
    with pytest.raises(ValueError, match="released|blocks"):
        BlockManager(num_blocks=20, block_size=BS).restore(bad)


def test_one_window_for_every_sliding_group() -> None:
    with pytest.raises(ValueError, match="one window"):
        TableLayout((None, 16, 32))
    with pytest.raises(ValueError, match="not both"):
        BlockManager(10, BS, sliding_window=16, layout=HYBRID)
