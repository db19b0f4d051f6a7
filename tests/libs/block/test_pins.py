"""Pins: a peer copying blocks holds references that keep them from eviction and reuse."""

from __future__ import annotations

import pytest

from quire.block import BlockManager
from quire.block.hashing import hash_full_blocks
from tests.libs.block.steps import BS, A, B, admit, commit, refcounts, run


def cached_a(num_blocks: int) -> BlockManager:
    """A manager whose only content is A's two full blocks, computed and freed (cached)."""
    m = BlockManager(num_blocks=num_blocks, block_size=BS)
    run(m, admits=(admit("a", A),))
    run(m, commits=(commit("a", len(A)),), frees=("a",))
    assert m.pool.num_cached_blocks == 2
    return m


def test_pin_takes_the_leading_run_of_indexed_hashes() -> None:
    m = cached_a(num_blocks=4)
    hashes = hash_full_blocks(A, BS, "")
    assert m.pin(hashes) == [0, 1]
    assert refcounts(m) == [1, 1, 0, 0]
    m.check_integrity()
    # A run stops at the first hash not held here; a first miss pins nothing.
    assert m.pin([hashes[0], *hash_full_blocks(B, BS, "")]) == [0]
    assert m.pin(hash_full_blocks(B, BS, "")) == []
    assert refcounts(m) == [2, 1, 0, 0]
    m.check_integrity()


def test_pinned_blocks_are_neither_evicted_nor_reused_until_unpinned() -> None:
    m = cached_a(num_blocks=4)
    pinned = m.pin(hash_full_blocks(A, BS, ""))
    # B needs 3 blocks; only 2 are free while A's two are pinned.
    result = run(m, admits=(admit("b", B),))
    assert result.not_admitted == ["b"]
    m.unpin(pinned)
    assert refcounts(m) == [0, 0, 0, 0] and m.pool.num_cached_blocks == 2
    assert m.num_pinned_blocks == 0
    # Unpinned, they are cached again: a prefix hit still finds them.
    assert run(m, admits=(admit("a2", A),)).num_cached_tokens == {"a2": 8}


def test_unpin_of_a_block_not_pinned_raises() -> None:
    m = cached_a(num_blocks=4)
    run(m, admits=(admit("a2", A),))  # referenced by a table, not by a pin
    with pytest.raises(ValueError, match="not pinned"):
        m.unpin([0])
