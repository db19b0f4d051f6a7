"""BlockManager.restore: rebuilding an empty manager from an executor's live sequences."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from quire.block import (
    BlockManager,
    ForkRequest,
    LiveSequenceState,
    hash_full_blocks,
)
from tests.libs.block.steps import BS, A, B, admit, append, commit, refcounts, run


def live(
    seq_id: str,
    tokens: Sequence[int],
    table: Sequence[int],
    num_computed: int,
    extra_key: str = "",
) -> LiveSequenceState:
    return LiveSequenceState(seq_id, tuple(tokens), tuple(table), num_computed, extra_key)


def restored(states: list[LiveSequenceState], num_blocks: int = 10, **kw: bool) -> BlockManager:
    manager = BlockManager(num_blocks=num_blocks, block_size=BS, **kw)
    manager.restore(states)
    manager.check_integrity()
    return manager


def test_refcounts_free_queue_and_tables() -> None:
    # a and its fork b share blocks 3 and 5 (partial); c hit a's first block.
    m = restored(
        [
            live("a", A[:6], [3, 5], 6),
            live("b", A[:6], [3, 5], 6),
            live("c", A[:4] + [1, 2], [3, 8], 4),
        ]
    )
    assert refcounts(m) == [0, 0, 0, 3, 0, 2, 0, 0, 1, 0]
    assert m.pool.free_block_ids() == [0, 1, 2, 4, 6, 7, 9]
    assert (m.block_table("a"), m.block_table("b"), m.block_table("c")) == ([3, 5], [3, 5], [3, 8])
    assert m.num_tokens("c") == 6
    stats = m.stats()
    assert (stats.num_blocks_used, stats.num_blocks_shared, stats.num_blocks_cached) == (3, 2, 0)


def test_full_computed_blocks_registered_first_writer_wins() -> None:
    hashes = hash_full_blocks(A, BS)
    # a computed 9 tokens (2 full blocks); b holds the same content in other blocks,
    # computed only 5 (1 full block): a is first, so the index keeps a's blocks.
    m = restored([live("a", A, [0, 1, 2], 9), live("b", A, [4, 5, 6], 5)])
    assert m.pool.lookup(hashes[0]) == 0 and m.pool.lookup(hashes[1]) == 1
    assert m.pool.block_hash(4) == hashes[0]  # a duplicate: recorded, not indexed
    assert m.pool.block_hash(5) is None  # not computed on b
    assert m.pool.block_hash(2) is None  # partial
    assert m.indexed_hashes() == hashes[:2]
    assert m.drain_index_events() == (hashes[:2], [])


def test_uncomputed_blocks_are_not_registered() -> None:
    m = restored([live("a", A, [7, 8, 9], 3)])
    assert m.indexed_hashes() == []
    assert [m.pool.block_hash(b) for b in (7, 8, 9)] == [None, None, None]


def test_prefix_caching_disabled_registers_nothing() -> None:
    m = restored([live("a", A, [0, 1, 2], 10)], enable_prefix_caching=False)
    assert m.indexed_hashes() == []
    assert refcounts(m)[:3] == [1, 1, 1]


def test_steps_continue_after_restore() -> None:
    m = restored([live("a", A[:6], [3, 5], 6), live("b", A[:6], [3, 5], 6)])
    # The shared partial block is copied on the first write (into the first free block).
    result = run(m, appends=(append("a", [1]), append("b", [2])))
    assert result.copies == [(5, 0)]
    assert result.block_tables == {"a": [3, 0], "b": [3, 5]}
    # a's full first block was computed: a new prompt hits it.
    result = run(m, admits=(admit("x", A[:4] + [9, 9]),))
    assert result.block_tables == {"x": [3, 1]}
    assert result.num_cached_tokens == {"x": 4}
    # Commits extend the restored hash chain; forks and frees work as usual.
    run(m, commits=(commit("a", 7),), forks=(ForkRequest("a", "a2"),), frees=("b",))
    assert refcounts(m)[:6] == [2, 1, 0, 3, 0, 0]


def test_restore_of_same_state_matches_the_original_manager() -> None:
    original = BlockManager(num_blocks=10, block_size=BS)
    run(original, admits=(admit("a", A), admit("b", B[:5])))
    run(original, commits=(commit("a", 10), commit("b", 5)))
    run(original, forks=(ForkRequest("a", "c"),), appends=(append("b", [1, 2, 3]),))
    states = [
        live(s, A if s != "b" else B[:5] + [1, 2, 3], original.block_table(s), n)
        for s, n in (("a", 10), ("b", 5), ("c", 10))
    ]
    m = restored(states)
    assert refcounts(m) == refcounts(original)
    assert sorted(m.indexed_hashes()) == sorted(original.indexed_hashes())
    for s in ("a", "b", "c"):
        assert m.block_table(s) == original.block_table(s)


BAD = [
    ("listed twice", [live("a", A[:4], [0], 4), live("a", B[:4], [1], 4)]),
    ("not a non-empty str", [live("", A[:4], [0], 4)]),
    ("has no token_ids", [live("a", [], [], 0)]),
    ("token id -1", [live("a", [1, -1], [0], 0)]),
    ("10 tokens need 3 blocks, block_table has 2", [live("a", A, [0, 1], 0)]),
    ("block id 10 is not in [0, 10)", [live("a", A, [0, 1, 10], 0)]),
    ("a block appears twice", [live("a", A, [0, 1, 0], 0)]),
    ("num_computed_tokens 11 is not in [0, 10]", [live("a", A, [0, 1, 2], 11)]),
    ("extra_key is not a str", [LiveSequenceState("a", (1,), (0,), 0, None)]),  # type: ignore[arg-type]
    (
        "block 1 is shared with seq_id 'a' but holds different tokens",
        [live("a", A, [0, 1, 2], 10), live("b", A[:4] + B[:4], [0, 1], 8)],
    ),
    (
        "block 0 is shared with seq_id 'a' but holds different tokens",
        [live("a", A[:4], [0], 4), live("b", A[:8], [3, 0], 8)],  # another index
    ),
    (
        "block 2 is shared with seq_id 'a'",
        [live("a", A, [0, 1, 2], 10), live("b", A[:9], [0, 1, 2], 8)],  # partial: other tail
    ),
    (
        "block 0 is shared with seq_id 'a'",
        [live("a", A[:4], [0], 4, "k1"), live("b", A[:4], [0], 4, "k2")],
    ),
]


@pytest.mark.parametrize(("message", "states"), BAD)
def test_invalid_live_sequences_raise_and_change_nothing(
    message: str, states: list[LiveSequenceState]
) -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    # A valid sequence first: nothing of it may remain either.
    with pytest.raises(ValueError, match="live_sequences: ") as info:
        m.restore([live("ok", B, [9, 8, 7], 10), *states])
    assert message in str(info.value)
    assert refcounts(m) == [0] * 10
    assert m.pool.free_block_ids() == list(range(10))
    assert m.indexed_hashes() == [] and m.drain_index_events() == ([], [])
    assert not m.has_seq("ok")
    m.check_integrity()


def test_restore_needs_an_empty_manager() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A),))
    with pytest.raises(ValueError, match="not empty"):
        m.restore([])
    run(m, commits=(commit("a", 10),), frees=("a",))
    with pytest.raises(ValueError, match="not empty"):  # cached blocks remain
        m.restore([])
    assert m.stats().num_blocks_cached == 2
    fresh = BlockManager(num_blocks=10, block_size=BS)
    fresh.restore([])
    fresh.check_integrity()
