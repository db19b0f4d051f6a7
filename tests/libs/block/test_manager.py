"""BlockManager on tiny pools: exact block ids, refcounts, copies and eviction order."""

from __future__ import annotations

from dataclasses import replace

import pytest

from quire.block import (
    AdmitRequest,
    BlockAllocator,
    BlockManager,
    ForkRequest,
    LocalBlockAllocator,
    StepAllocation,
)
from tests.libs.block.steps import BS, A, B, admit, append, commit, refcounts, run


def snapshot(manager: BlockManager) -> object:
    seqs = {s: manager.block_table(s) for s in ("a", "b", "c", "x") if manager.has_seq(s)}
    hashes = [manager.pool.block_hash(b) for b in range(manager.num_blocks)]
    return seqs, refcounts(manager), manager.pool.free_block_ids(), hashes, manager.stats()


def test_local_allocator_is_block_manager() -> None:
    assert LocalBlockAllocator is BlockManager
    allocator: BlockAllocator = LocalBlockAllocator(num_blocks=4)  # mypy checks the protocol
    assert (allocator.num_blocks, allocator.block_size) == (4, 16)
    assert allocator.stats().num_blocks_total == 4


def test_fresh_allocation_order() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    result = run(m, admits=(admit("a", A), admit("b", A[:4])))
    assert result.block_tables == {"a": [0, 1, 2], "b": [3]}
    assert result.num_cached_tokens == {"a": 0, "b": 0}
    assert result.copies == [] and result.preempted == [] and result.not_admitted == []
    assert m.num_free_blocks == 6
    assert refcounts(m)[:5] == [1, 1, 1, 1, 0]
    assert m.pool.free_block_ids() == [4, 5, 6, 7, 8, 9]


def test_append_spanning_several_blocks() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", [1, 2, 3]),))
    result = run(m, appends=(append("a", range(10)),))
    assert result.block_tables == {"a": [0, 1, 2, 3]}
    assert m.num_tokens("a") == 13
    result = run(m, appends=(append("a"),))  # empty append: no change, still reported
    assert result.block_tables == {"a": [0, 1, 2, 3]}


def test_commit_registers_full_blocks_below_mark() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A),))
    run(m, commits=(commit("a", 7),))
    assert m.pool.block_hash(0) is not None
    assert m.pool.block_hash(1) is None
    run(m, commits=(commit("a", 10),))
    assert m.pool.block_hash(1) is not None
    assert m.pool.block_hash(2) is None  # partial block never hashed
    run(m, commits=(commit("a", 3),))  # a stale, lower mark changes nothing
    assert m.pool.block_hash(1) is not None


def test_prefix_hit_shares_blocks() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A),))
    result = run(m, commits=(commit("a", 10),), admits=(admit("b", A[:8] + [7, 7, 7]),))
    assert result.block_tables == {"b": [0, 1, 3]}
    assert result.num_cached_tokens == {"b": 8}
    assert refcounts(m)[:4] == [2, 2, 1, 1]
    stats = m.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (21, 8)
    assert stats.num_blocks_shared == 2
    assert stats.num_blocks_used == 4


def test_hit_stops_at_first_miss() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A),))
    changed = A[:4] + [0] + A[5:]
    result = run(m, commits=(commit("a", 10),), admits=(admit("b", changed),))
    assert result.block_tables == {"b": [0, 3, 4]}
    assert result.num_cached_tokens == {"b": 4}


def test_extra_key_separates_caches() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A, extra_key="lora-1"),))
    result = run(
        m,
        commits=(commit("a", 10),),
        admits=(admit("b", A, extra_key="lora-2"), admit("c", A, extra_key="lora-1")),
    )
    assert result.num_cached_tokens == {"b": 0, "c": 8}
    assert result.block_tables == {"b": [3, 4, 5], "c": [0, 1, 6]}


def test_last_token_always_recomputed() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A[:8]),))
    result = run(
        m,
        commits=(commit("a", 8),),
        admits=(admit("b", A[:8]), admit("c", A[:9])),
    )
    # b is exactly two cached blocks: only the first is a hit, the second is recomputed.
    assert result.num_cached_tokens == {"b": 4, "c": 8}
    assert result.block_tables == {"b": [0, 2], "c": [0, 1, 3]}


def test_first_writer_wins() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A), admit("b", A)))  # same step: no hits
    assert m.block_table("b") == [3, 4, 5]
    run(m, commits=(commit("a", 10), commit("b", 10)))
    assert m.pool.lookup(m.pool.block_hash(3) or b"") == 0  # b's block 3 is a duplicate
    result = run(m, admits=(admit("c", A),))
    assert result.block_tables == {"c": [0, 1, 6]}


def test_freed_cached_blocks_reusable_by_hash() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A[:8]),))
    run(m, commits=(commit("a", 8),), frees=("a",))
    assert m.pool.free_block_ids() == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]  # tail first
    assert m.stats().num_blocks_cached == 2 and m.stats().num_blocks_used == 0
    result = run(m, admits=(admit("b", A[:9]),))
    assert result.block_tables == {"b": [0, 1, 2]}
    assert result.num_cached_tokens == {"b": 8}
    assert m.pool.free_block_ids() == [3, 4, 5, 6, 7, 8, 9]
    assert m.stats().num_blocks_cached == 0


def test_lru_eviction_order_tail_first() -> None:
    m = BlockManager(num_blocks=6, block_size=BS)
    run(m, admits=(admit("a", A[:8]), admit("b", B[:8])))
    assert (m.block_table("a"), m.block_table("b")) == ([0, 1], [2, 3])
    run(m, commits=(commit("a", 8), commit("b", 8)))
    run(m, frees=("a", "b"))
    assert m.pool.free_block_ids() == [4, 5, 1, 0, 3, 2]
    # A new prompt takes the never-used blocks, then a's tail block, keeping a's head.
    result = run(m, admits=(admit("c", range(12)),))
    assert result.block_tables == {"c": [4, 5, 1]}
    assert m.pool.num_evictions == 1
    result = run(m, admits=(admit("x", A[:9]),))
    assert result.num_cached_tokens == {"x": 4}  # block 0 survived, block 1 was evicted
    assert result.block_tables == {"x": [0, 3, 2]}
    assert m.pool.num_evictions == 3
    assert m.stats().num_blocks_cached == 0


def test_fork_copy_on_write_exact_pairs() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A[:6]),))
    forks = tuple(ForkRequest("a", child) for child in ("b", "c", "d"))
    result = run(m, forks=forks)
    assert result.block_tables == {"b": [0, 1], "c": [0, 1], "d": [0, 1]}
    assert refcounts(m)[:2] == [4, 4]
    assert m.stats().num_blocks_shared == 2
    result = run(m, appends=tuple(append(s, [1]) for s in ("a", "b", "c", "d")))
    # The first three writers copy the shared partial block; the last owner writes in place.
    assert result.copies == [(1, 2), (1, 3), (1, 4)]
    assert result.block_tables == {"a": [0, 2], "b": [0, 3], "c": [0, 4], "d": [0, 1]}
    assert refcounts(m)[:5] == [4, 1, 1, 1, 1]
    assert m.stats().num_copies == 3


def test_full_shared_blocks_never_copied() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A[:8]),))
    result = run(m, forks=(ForkRequest("a", "b"),), appends=(append("a", [1]), append("b", [2])))
    assert result.copies == []
    assert result.block_tables == {"a": [0, 1, 2], "b": [0, 1, 3]}
    assert refcounts(m)[:4] == [2, 2, 1, 1]


def test_fork_and_append_same_step() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A[:6]),))
    result = run(m, forks=(ForkRequest("a", "b"),), appends=(append("a", [1]), append("b", [2])))
    assert result.copies == [(1, 2)]
    assert result.block_tables == {"a": [0, 2], "b": [0, 1]}


def test_preemption_from_end_of_appends() -> None:
    m = BlockManager(num_blocks=4, block_size=BS)
    run(m, admits=tuple(admit(s, range(4)) for s in "abcd"))
    result = run(m, appends=tuple(append(s, [9]) for s in "abcd"))
    assert result.preempted == ["d", "c"]
    assert result.block_tables == {"a": [0, 3], "b": [1, 2]}
    assert not m.has_seq("c") and not m.has_seq("d")
    assert m.stats().num_preemptions == 2
    assert m.num_free_blocks == 0


def test_preemption_candidates_with_empty_appends() -> None:
    m = BlockManager(num_blocks=3, block_size=BS)
    run(m, admits=(admit("a", range(4)), admit("b", range(8))))
    result = run(m, appends=(append("a", [1]), append("b")), admits=(admit("x", [1]),))
    assert result.preempted == ["b"]
    assert result.block_tables == {"a": [0, 2]}
    assert m.pool.free_block_ids() == [1]
    # x would fit, but preempted work goes back first: no admits in this step.
    assert result.not_admitted == ["x"]
    assert not m.has_seq("x")


def test_sequence_that_must_preempt_itself() -> None:
    m = BlockManager(num_blocks=2, block_size=BS)
    run(m, admits=(admit("a", range(4)), admit("b", range(4))))
    result = run(m, appends=(append("a", range(8)), append("b", [1])))
    assert result.preempted == ["b", "a"]
    assert result.block_tables == {}
    assert m.num_free_blocks == 2 and m.stats().num_blocks_used == 0


def test_preempting_fork_sibling_removes_copy() -> None:
    m = BlockManager(num_blocks=2, block_size=BS)
    run(m, admits=(admit("a", A[:6]),))
    result = run(m, forks=(ForkRequest("a", "b"),), appends=(append("a", [1]), append("b")))
    assert result.preempted == ["b"]
    assert result.copies == []
    assert result.block_tables == {"a": [0, 1]}  # the preempted child is not reported


def test_preempting_last_owner_withdraws_copy() -> None:
    # a copies its shared partial block 0 (shared with z); then y's own copy-on-write
    # preempts z, which leaves block 0 free. Reusing block 0 as y's copy destination
    # would make it both source and destination of this step's copies, so a takes
    # block 0 back instead and its copy is withdrawn.
    m = BlockManager(num_blocks=4, block_size=2)
    run(m, admits=(admit("a", [1]), admit("w", [2]), admit("f", [5, 6])))
    run(m, forks=(ForkRequest("a", "z"), ForkRequest("w", "y")))
    appends = (append("a", [7]), append("f"), append("w"), append("y", [8]), append("z"))
    result = run(m, appends=appends)
    assert result.preempted == ["z"]
    assert result.copies == [(1, 3)]
    assert result.block_tables == {"a": [0], "f": [2], "w": [1], "y": [3]}
    assert m.stats().num_copies == 1


def test_fcfs_admission_stops_at_first_misfit() -> None:
    m = BlockManager(num_blocks=4, block_size=BS)
    result = run(m, admits=(admit("a", range(8)), admit("b", range(12)), admit("c", range(4))))
    assert result.block_tables == {"a": [0, 1]}
    assert result.not_admitted == ["b", "c"]  # c would fit, but FCFS stops at b
    assert not m.has_seq("b") and not m.has_seq("c")
    assert m.stats().prefix_cache_queries == 8


def test_failed_admit_leaves_no_trace() -> None:
    m = BlockManager(num_blocks=4, block_size=BS)
    run(m, admits=(admit("a", A[:8]),))
    run(m, commits=(commit("a", 8),))
    run(m, frees=("a",))
    run(m, admits=(admit("b", range(12)),))
    assert m.block_table("b") == [2, 3, 1]
    assert m.pool.free_block_ids() == [0]  # a's head block, still cached
    before = snapshot(m)
    # Hits cached block 0 (free) and needs 3 fresh blocks: 4 > 1 free.
    result = run(m, admits=(admit("c", A[:4] + list(range(9))),))
    assert result.not_admitted == ["c"]
    assert snapshot(m) == before
    assert m.pool.lookup(m.pool.block_hash(0) or b"") == 0


def test_cached_hit_counts_against_free_pool() -> None:
    m = BlockManager(num_blocks=3, block_size=BS)
    run(m, admits=(admit("a", A[:8]),))
    run(m, commits=(commit("a", 8),))
    run(m, frees=("a",))
    # 9 tokens: 2 cached free blocks + 1 fresh == 3 free blocks: fits exactly.
    result = run(m, admits=(admit("b", A[:9]),))
    assert result.block_tables == {"b": [0, 1, 2]}
    assert m.num_free_blocks == 0


def test_readmit_after_free_in_same_step() -> None:
    m = BlockManager(num_blocks=4, block_size=BS)
    run(m, admits=(admit("a", A[:8]),))
    result = run(m, frees=("a",), admits=(admit("a", A[:5]),))
    assert result.block_tables == {"a": [2, 3]}


def test_disabled_prefix_caching_never_hits() -> None:
    m = BlockManager(num_blocks=10, block_size=BS, enable_prefix_caching=False)
    run(m, admits=(admit("a", A[:8]),))
    run(m, commits=(commit("a", 8),))
    assert m.pool.block_hash(0) is None
    run(m, frees=("a",))
    result = run(m, admits=(admit("b", A[:9]),))
    assert result.num_cached_tokens == {"b": 0}
    assert result.block_tables == {"b": [2, 3, 4]}
    stats = m.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits, stats.num_blocks_cached) == (
        0,
        0,
        0,
    )


def test_block_table_is_a_copy() -> None:
    m = BlockManager(num_blocks=4, block_size=BS)
    result = run(m, admits=(admit("a", range(5)),))
    result.block_tables["a"].append(3)
    m.block_table("a").append(3)
    assert m.block_table("a") == [0, 1]
    m.check_integrity()


def _live_manager() -> BlockManager:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A), admit("b", B[:3]), admit("x", [5])))
    return m


MISUSE: list[tuple[str, StepAllocation]] = [
    ("frees: unknown seq_id 'zz'", StepAllocation(frees=("zz",))),
    ("frees: seq_id 'a' listed twice", StepAllocation(frees=("a", "a"))),
    ("commits: unknown seq_id 'zz'", StepAllocation(commits=(commit("zz", 1),))),
    (
        "commits: unknown seq_id 'c'",
        StepAllocation(commits=(commit("c", 1),), admits=(admit("c", [1]),)),
    ),
    ("commits: num_computed_tokens -1 of seq_id 'a'", StepAllocation(commits=(commit("a", -1),))),
    ("commits: num_computed_tokens 11 of seq_id 'a'", StepAllocation(commits=(commit("a", 11),))),
    (
        "commits: seq_id 'a' listed twice",
        StepAllocation(commits=(commit("a", 1), commit("a", 2))),
    ),
    ("forks: unknown parent_seq_id 'zz'", StepAllocation(forks=(ForkRequest("zz", "c"),))),
    ("forks: child_seq_id 'b' already exists", StepAllocation(forks=(ForkRequest("a", "b"),))),
    ("forks: child_seq_id 'a' already exists", StepAllocation(forks=(ForkRequest("a", "a"),))),
    (
        "forks: child_seq_id 'c' already exists",
        StepAllocation(forks=(ForkRequest("a", "c"), ForkRequest("b", "c"))),
    ),
    ("appends: unknown seq_id 'zz'", StepAllocation(appends=(append("zz", [1]),))),
    (
        "appends: unknown seq_id 'a'",
        StepAllocation(frees=("a",), appends=(append("a", [1]),)),
    ),
    (
        "appends: seq_id 'a' listed twice",
        StepAllocation(appends=(append("a", [1]), append("a", [2]))),
    ),
    ("appends: seq_id 'a'", StepAllocation(appends=(append("a", [-1]),))),
    ("admits: seq_id 'a' is already live", StepAllocation(admits=(admit("a", [1]),))),
    (
        "admits: seq_id 'c' is already live",
        StepAllocation(forks=(ForkRequest("a", "c"),), admits=(admit("c", [1]),)),
    ),
    (
        "admits: seq_id 'c' listed twice",
        StepAllocation(admits=(admit("c", [1]), admit("c", [2]))),
    ),
    ("admits: seq_id 'c' has no token_ids", StepAllocation(admits=(admit("c", []),))),
    ("admits: seq_id 'c'", StepAllocation(admits=(admit("c", [2**32]),))),
]


@pytest.mark.parametrize(("message", "request_"), MISUSE, ids=[m for m, _ in MISUSE])
def test_misuse_raises_and_changes_nothing(message: str, request_: StepAllocation) -> None:
    m = _live_manager()
    before = snapshot(m)
    # Valid work ahead of the bad field (freeing x) must not be applied either.
    full = replace(request_, frees=request_.frees or ("x",))
    for req in (request_, full):
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            m.step(req)
        assert snapshot(m) == before
        m.check_integrity()


def test_fork_commit_free_same_step() -> None:
    # Forks, then commits, then frees: a parent finishing on its first token can
    # still be forked, and a finished sequence's computed blocks stay reusable.
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A),))
    result = run(
        m,
        forks=(ForkRequest("a", "b"), ForkRequest("b", "c")),
        commits=(commit("a", 10), commit("c", 4)),
        frees=("a", "c"),
        appends=(append("b", [1]),),
    )
    assert result.block_tables == {"b": [0, 1, 2]}  # c was freed: not reported
    assert result.copies == []  # b is the last owner of the partial block
    assert refcounts(m)[:4] == [1, 1, 1, 0]
    assert m.pool.block_hash(1) is not None
    run(m, frees=("b",))
    result = run(m, admits=(admit("x", A),))
    assert result.num_cached_tokens == {"x": 8}


def test_query_misuse() -> None:
    m = _live_manager()
    with pytest.raises(ValueError, match="unknown seq_id 'zz'"):
        m.block_table("zz")
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(num_blocks=4, block_size=0)
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(num_blocks=0)


def test_check_integrity_detects_corruption() -> None:
    m = _live_manager()
    m.pool._refcounts[0] += 1
    with pytest.raises(AssertionError, match="block 0"):
        m.check_integrity()
    m.pool._refcounts[0] -= 1
    m.check_integrity()
    m._seqs["a"].token_ids.extend(range(5))
    with pytest.raises(AssertionError, match="seq 'a'"):
        m.check_integrity()


def test_skip_prefix_cache_reads_nothing_but_its_blocks_are_still_shared() -> None:
    m = BlockManager(num_blocks=10, block_size=BS)
    run(m, admits=(admit("a", A),))
    run(m, commits=(commit("a", 10),))
    skipping = AdmitRequest("b", tuple(A), skip_prefix_cache=True)
    result = run(m, admits=(skipping,))
    assert result.block_tables == {"b": [3, 4, 5]} and result.num_cached_tokens == {"b": 0}
    # Once b's KV is written, its full blocks are findable too; a (first writer) still wins.
    run(m, commits=(commit("b", 10),), frees=("a",))
    result = run(m, admits=(admit("c", A),))
    assert result.num_cached_tokens == {"c": 8}
    assert result.block_tables["c"][:2] == [0, 1]
