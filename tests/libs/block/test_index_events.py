"""Prefix-index events: what entered and left the index since the last drain, exactly."""

from __future__ import annotations

from quire.block import BlockManager, hash_full_blocks
from tests.libs.block.steps import BS, A, B, admit, commit, run

HA = hash_full_blocks(A, BS)
HB = hash_full_blocks(B, BS)
C = list(range(300, 312))  # 3 full blocks
HC = hash_full_blocks(C, BS)


def test_commits_add_hashes_and_drain_clears() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A), admit("b", B)))
    assert m.drain_index_events() == ([], [])  # admitted, nothing computed yet
    run(m, commits=(commit("a", 5), commit("b", 8)))
    assert m.drain_index_events() == ([HA[0], HB[0], HB[1]], [])
    assert m.drain_index_events() == ([], [])
    run(m, commits=(commit("a", 10),))
    assert m.drain_index_events() == ([HA[1]], [])
    assert m.indexed_hashes() == [HA[0], HB[0], HB[1], HA[1]]


def test_duplicates_and_hits_add_nothing() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A), admit("b", A)))  # same step: b holds duplicates
    run(m, commits=(commit("a", 10), commit("b", 10)))
    assert m.drain_index_events() == (HA, [])
    run(m, admits=(admit("c", A),), frees=("a", "b"))  # a prefix hit, then frees
    assert m.drain_index_events() == ([], [])


def test_eviction_removes_hashes_in_eviction_order() -> None:
    m = BlockManager(num_blocks=4, block_size=BS)
    run(m, admits=(admit("a", A[:8]),))
    run(m, commits=(commit("a", 8),), frees=("a",))
    assert m.drain_index_events() == (HA, [])
    assert m.pool.free_block_ids() == [2, 3, 1, 0]
    run(m, admits=(admit("b", B[:12]),))  # takes 2, 3, then evicts a's tail block 1
    assert m.drain_index_events() == ([], [HA[1]])
    run(m, frees=("b",))
    run(m, admits=(admit("c", B[:4] + [1]),))  # misses (b never committed): evicts block 0
    assert m.drain_index_events() == ([], [HA[0]])
    assert m.indexed_hashes() == []


def test_net_change_between_drains() -> None:
    m = BlockManager(num_blocks=3, block_size=BS)
    run(m, admits=(admit("a", A[:4]),))
    run(m, commits=(commit("a", 4),), frees=("a",))
    # Indexed, then evicted before anyone drained: no net change.
    run(m, admits=(admit("b", C),))
    assert m.indexed_hashes() == []
    assert m.drain_index_events() == ([], [])
    run(m, commits=(commit("b", 12),), frees=("b",))
    assert m.drain_index_events() == (HC, [])
    # Evicted, then indexed again under another block: no net change either.
    run(m, admits=(admit("c", C[4:8] + [1]),))  # evicts b's blocks 2 and 1 (tail first)
    run(m, frees=("c",))
    run(m, admits=(admit("d", C),))  # hits block 0, recomputes the rest
    run(m, commits=(commit("d", 12),))
    assert m.drain_index_events() == ([], [])
    assert sorted(m.indexed_hashes()) == sorted(HC)
