"""HostBlockPool: hash keys, LRU eviction by bytes, exact bytes back, capacity 0 disables."""

from __future__ import annotations

import pytest
import torch

from quire.block.hashing import hash_full_blocks
from quire.cache.host_pool import HostBlockPool

BLOCK_BYTES = 4 * 8 * 4  # a [4, 8] float32 block


def block(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((4, 8), generator=generator)


HASHES = hash_full_blocks(list(range(40)), 4, "model")  # 10 chained block hashes


def test_a_block_read_back_is_the_one_written_bit_for_bit() -> None:
    pool = HostBlockPool(10 * BLOCK_BYTES)
    written = block(0)
    expected = written.clone()
    assert pool.put(HASHES[0], written)
    got = pool.get(HASHES[0])
    assert got is not None
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))
    assert pool.get(HASHES[1]) is None
    assert HASHES[0] in pool and HASHES[1] not in pool


def test_keys_are_chained_hashes_with_the_extra_key() -> None:
    pool = HostBlockPool(10 * BLOCK_BYTES)
    pool.put(HASHES[0], block(0))
    # The same tokens under another extra key (model, LoRA) are another block.
    assert hash_full_blocks(list(range(4)), 4, "other")[0] not in pool
    assert hash_full_blocks(list(range(4)), 4, "model")[0] in pool
    # A second put of a held hash stores nothing new (forks share their prompt blocks).
    assert pool.put(HASHES[0], block(1))
    assert len(pool) == 1 and pool.stats().num_puts == 1
    assert torch.equal(pool.get(HASHES[0]), block(0))  # type: ignore[arg-type]


def test_lru_eviction_by_bytes() -> None:
    pool = HostBlockPool(3 * BLOCK_BYTES)
    for i in range(3):
        assert pool.put(HASHES[i], block(i))
    assert pool.num_bytes_used == 3 * BLOCK_BYTES
    pool.get(HASHES[0])  # 0 is now the most recently used: 1 is the oldest
    assert pool.put(HASHES[3], block(3))
    assert [h in pool for h in HASHES[:4]] == [True, False, True, True]
    pool.touch(HASHES[2])
    # A block twice the size evicts the two oldest (0, then 3).
    assert pool.put(HASHES[4], torch.zeros((8, 8)))
    assert [h in pool for h in HASHES[:5]] == [False, False, True, False, True]
    stats = pool.stats()
    assert stats.num_bytes_used == 3 * BLOCK_BYTES and stats.num_evictions == 3
    assert stats.usage == 1.0
    # A block larger than the whole pool is refused and evicts nothing.
    assert not pool.put(HASHES[5], torch.zeros((16, 8)))
    assert len(pool) == 2


def test_capacity_zero_holds_nothing() -> None:
    pool = HostBlockPool(0)
    assert not pool.can_hold(BLOCK_BYTES)
    assert not pool.put(HASHES[0], block(0))
    assert len(pool) == 0 and pool.get(HASHES[0]) is None
    assert pool.stats().usage == 0.0


def test_negative_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity_bytes"):
        HostBlockPool(-1)
