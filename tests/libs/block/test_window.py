"""Blocks outside a sliding window are released on commit: exact ids, refcounts, cache states."""

from __future__ import annotations

import pytest

from quire.block import (
    RELEASED_BLOCK,
    BlockManager,
    BlockTables,
    ForkRequest,
    StepAllocation,
    TableUpdate,
    first_needed_block,
)
from tests.libs.block.steps import admit, append, commit, refcounts, run

BS = 16
WINDOW = 32  # two blocks: a decoding sequence holds at most WINDOW // BS + 1 = 3
R = RELEASED_BLOCK
PROMPT = list(range(1000, 1020))  # 20 tokens: one full block and 4


def decode(m: BlockManager, seq_id: str, num_steps: int, first_token: int = 1) -> int:
    """`num_steps` decode steps, the way the engine runs them: every token so far is
    computed (committed) and one more is appended. Returns the most blocks the sequence's
    table held at once."""
    most = 0
    for i in range(num_steps):
        num_tokens = m.num_tokens(seq_id)
        run(m, commits=(commit(seq_id, num_tokens),), appends=(append(seq_id, [first_token + i]),))
        most = max(most, sum(b != R for b in m.block_table(seq_id)))
    return most


def test_first_needed_block_is_the_block_of_the_first_key_in_the_next_window() -> None:
    # After c computed tokens the next token sits at position c and reads c - W + 1 .. c.
    assert first_needed_block(0, WINDOW, BS) == 0
    assert first_needed_block(46, WINDOW, BS) == 0  # reads 15 .. 46
    assert first_needed_block(47, WINDOW, BS) == 1  # reads 16 .. 47
    assert first_needed_block(63, WINDOW, BS) == 2  # reads 32 .. 63
    assert first_needed_block(5, 1, 4) == 1  # a window of one reads the token itself


def test_decoding_sequence_holds_at_most_window_blocks_plus_one() -> None:
    m = BlockManager(num_blocks=10, block_size=BS, sliding_window=WINDOW)
    assert run(m, admits=(admit("a", PROMPT),)).block_tables == {"a": [0, 1]}
    most = decode(m, "a", 27)  # 47 tokens, the first 46 committed
    assert most == 3
    assert m.block_table("a") == [0, 1, 2]
    result = run(m, commits=(commit("a", 47),), appends=(append("a", [7]),))
    # c = 47: the next token reads 16 .. 47, block 0 is released (kept cached by hash)
    assert result.table_updates == {"a": TableUpdate(0, (R, 1, 2))}
    assert refcounts(m)[:4] == [0, 1, 1, 0]
    assert m.pool.free_block_ids()[-1] == 0
    assert m.stats().num_blocks_cached == 1
    assert decode(m, "a", 100, first_token=8) == WINDOW // BS + 1
    table = m.block_table("a")
    assert len(table) == 10  # 148 tokens: the table keeps its length
    assert table[:7] == [R] * 7 and sum(refcounts(m)) == 3


def test_release_is_one_update_from_the_first_released_slot() -> None:
    m = BlockManager(num_blocks=10, block_size=BS, sliding_window=WINDOW)
    run(m, admits=(admit("a", list(range(80))),))  # 5 blocks, a chunked prefill
    result = run(m, commits=(commit("a", 64),))
    assert result.table_updates == {"a": TableUpdate(0, (R, R, 2, 3, 4))}
    result = run(m, commits=(commit("a", 80),), appends=(append("a", [1]),))
    # the next token reads 49 .. 80: slot 2 released, block 5 appended, one update
    assert result.table_updates == {"a": TableUpdate(2, (R, 3, 4, 5))}
    assert m.pool.free_block_ids()[-3:] == [1, 0, 2]  # latest released first, per commit


def test_released_blocks_stay_cached_for_a_prefix_hit() -> None:
    m = BlockManager(num_blocks=10, block_size=BS, sliding_window=WINDOW)
    run(m, admits=(admit("a", list(range(64))),))
    run(m, commits=(commit("a", 64),))  # blocks 0, 1 released, cached
    result = run(m, admits=(admit("b", list(range(40))),))
    assert result.block_tables == {"b": [0, 1, 4]}
    assert result.num_cached_tokens == {"b": 32}
    assert refcounts(m)[:5] == [1, 1, 1, 1, 1]


def test_without_prefix_caching_released_blocks_are_plainly_free() -> None:
    m = BlockManager(10, BS, enable_prefix_caching=False, sliding_window=WINDOW)
    run(m, admits=(admit("a", list(range(64))),))
    run(m, commits=(commit("a", 64),))
    assert m.block_table("a") == [R, R, 2, 3]
    assert m.pool.block_hash(0) is None and m.stats().num_blocks_cached == 0
    assert m.num_free_blocks == 8


def test_a_model_with_a_global_layer_keeps_every_block() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)  # no window: Gemma's global layers read all
    run(m, admits=(admit("a", PROMPT),))
    assert decode(m, "a", 60) == 5
    assert R not in m.block_table("a")


def test_free_fork_and_preemption_skip_released_slots() -> None:
    m = BlockManager(num_blocks=6, block_size=BS, sliding_window=WINDOW)
    run(m, admits=(admit("a", list(range(50))),))  # blocks 0..3
    run(m, commits=(commit("a", 50),))  # the next token reads 19 .. 50: 0 released
    result = run(m, forks=(ForkRequest("a", "b"),))
    assert result.block_tables == {"b": [R, 1, 2, 3]}
    assert refcounts(m)[:6] == [0, 2, 2, 2, 0, 0]
    # b writes into the shared partial block 3: copy-on-write into a fresh block
    result = run(m, appends=(append("a", [1]), append("b", [2])))
    assert result.copies == [(3, 4)]
    assert result.block_tables == {"a": [R, 1, 2, 4], "b": [R, 1, 2, 3]}
    # a needs one more block than is free: b, the latest, is preempted
    result = run(m, appends=(append("a", list(range(60))), append("b")))
    assert result.preempted == ["b"] and m.block_table("a") == [R, 1, 2, 4, 5, 0, 3]
    run(m, frees=("a",))
    assert sum(refcounts(m)) == 0 and m.num_free_blocks == 6


def test_restore_takes_released_slots_back() -> None:
    m = BlockManager(num_blocks=10, block_size=BS, sliding_window=WINDOW)
    run(m, admits=(admit("a", list(range(90))),))
    run(m, commits=(commit("a", 64),))
    live = BlockTables(BS)
    live.reset(m.live_sequences())
    restored = BlockManager(num_blocks=10, block_size=BS, sliding_window=WINDOW)
    restored.restore(live.live_sequences())
    restored.check_integrity()
    assert restored.block_table("a") == [R, R, 2, 3, 4, 5]
    assert refcounts(restored)[:7] == [0, 0, 1, 1, 1, 1, 0]
    assert restored.pool.block_hash(2) is not None  # registered: computed and present
    step = StepAllocation(commits=(commit("a", 90),), appends=(append("a", [1]),))
    assert restored.step(step).table_updates == {"a": TableUpdate(2, (R, 3, 4, 5))}
    restored.check_integrity()


def test_restore_refuses_released_slots_a_window_still_reads() -> None:
    m = BlockManager(num_blocks=10, block_size=BS, sliding_window=WINDOW)
    run(m, admits=(admit("a", list(range(64))),))
    run(m, commits=(commit("a", 64),))
    live = m.live_sequences()
    with pytest.raises(ValueError, match="released"):
        BlockManager(num_blocks=10, block_size=BS).restore(live)
    with pytest.raises(ValueError, match="released"):
        BlockManager(num_blocks=10, block_size=BS, sliding_window=48).restore(live)
