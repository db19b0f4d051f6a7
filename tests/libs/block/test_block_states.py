"""BlockManager.block_states: one byte per block (free, used, cached, shared), exact ids."""

from __future__ import annotations

from quire.block import AdmitRequest, BlockManager, BlockPool, BlockState, CommitRequest
from quire.block import StepAllocation as Step

BS = 4
A = tuple(range(100, 110))  # 10 tokens: 2 full blocks + 2
F, U, C, S = BlockState.FREE, BlockState.USED, BlockState.CACHED, BlockState.SHARED


def states(manager: BlockManager) -> list[BlockState]:
    return [BlockState(b) for b in manager.block_states()]


def check_counts(manager: BlockManager) -> None:
    got = states(manager)
    stats = manager.stats()
    assert got.count(U) + got.count(S) == stats.num_blocks_used
    assert got.count(C) == stats.num_blocks_cached
    assert got.count(S) == stats.num_blocks_shared


def test_states_follow_admits_hits_frees_and_eviction() -> None:
    manager = BlockManager(num_blocks=8, block_size=BS)
    assert manager.block_states() == bytes(8)

    manager.step(Step(admits=(AdmitRequest("a", A),)))
    assert states(manager) == [U, U, U, F, F, F, F, F]

    # b hits a's two full blocks once a has committed them: those are shared.
    manager.step(
        Step(commits=(CommitRequest("a", 10),), admits=(AdmitRequest("b", A[:8] + (7, 7, 7)),))
    )
    assert states(manager) == [S, S, U, U, F, F, F, F]
    check_counts(manager)

    manager.step(Step(frees=("a",)))
    assert states(manager) == [U, U, F, U, F, F, F, F]  # a's partial block had no hash

    manager.step(Step(frees=("b",)))
    assert states(manager) == [C, C, F, F, F, F, F, F]  # findable by hash until reused
    check_counts(manager)

    # Seven fresh blocks: the LRU queue hands out 4..7, 2, 3, then evicts cached block 1.
    manager.step(Step(admits=(AdmitRequest("c", tuple(range(500, 528))),)))
    assert manager.block_table("c") == [4, 5, 6, 7, 2, 3, 1]
    assert states(manager) == [C, U, U, U, U, U, U, U]
    check_counts(manager)


def test_a_free_duplicate_is_not_cached() -> None:
    pool = BlockPool(3)
    first, second = pool.allocate(), pool.allocate()
    assert first is not None and second is not None
    pool.register(first, b"h" * 16)
    pool.register(second, b"h" * 16)  # the index keeps the first writer
    pool.release(first)
    pool.release(second)
    assert list(pool.block_states()) == [C, F, F]
