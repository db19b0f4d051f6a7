"""BlockPool: physical KV blocks, their refcounts, the LRU free queue and the hash index.

Every block is in exactly one of two states:

- used: refcount > 0, referenced by at least one block table;
- free: refcount 0, in the free queue. A free block that still carries a hash is
  *cached*: a prefix hit can take it back (`touch`) without recomputing its KV.

The free queue is in LRU order: `allocate` takes from the front, `release`
appends to the back, `touch` removes a cached block from the middle in O(1)
(an OrderedDict keyed by block id). A cached block's hash leaves the index only
when the block is popped for reuse, so blocks stay findable as long as possible.

Index changes are recorded for publishing (the memory manager mirrors the index
into Redis): `drain_index_events` returns the net change since its last call.
"""

from __future__ import annotations

from collections import OrderedDict
from enum import IntEnum


class BlockState(IntEnum):
    """What one physical block holds, one byte per block in `BlockPool.block_states`."""

    FREE = 0  # refcount 0, nothing findable: the next allocation may take it
    USED = 1  # refcount 1: one block table references it
    CACHED = 2  # refcount 0 but indexed by hash: a prefix hit can take it back
    SHARED = 3  # refcount > 1: several block tables reference it (prefix hit or fork)


class BlockPool:
    """`num_blocks` physical blocks with ids 0..num_blocks-1, all free at first."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks: must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self._refcounts = [0] * num_blocks
        # Chained hash of a block's content once registered (the block is immutable
        # from then on); None for blocks still being written.
        self._hashes: list[bytes | None] = [None] * num_blocks
        # Free blocks, least recently freed first. Values are unused.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # hash -> the block findable under it (first writer wins).
        self._index: dict[bytes, int] = {}
        # Cached blocks whose hash was dropped from the index to reuse them.
        self.num_evictions = 0
        # hash -> whether it was indexed at the last drain, for every hash whose
        # presence differs from then; holds at most 2 * num_blocks entries.
        self._index_changes: dict[bytes, bool] = {}
        # Kept up to date by every mutation so stats() never scans the pool.
        self._num_cached = 0  # refcount 0 and indexed under its hash
        self._num_shared = 0  # refcount > 1

    # ---------------------------------------------------------------- queries

    @property
    def num_free_blocks(self) -> int:
        """Blocks with refcount 0 (cached or not): what `allocate` can hand out."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Free blocks still findable by hash."""
        return self._num_cached

    @property
    def num_shared_blocks(self) -> int:
        return self._num_shared

    def refcount(self, block_id: int) -> int:
        self._check_id(block_id)
        return self._refcounts[block_id]

    def refcounts(self) -> list[int]:
        """Every block's refcount, by block id (a copy)."""
        return list(self._refcounts)

    def block_hash(self, block_id: int) -> bytes | None:
        self._check_id(block_id)
        return self._hashes[block_id]

    def is_free(self, block_id: int) -> bool:
        self._check_id(block_id)
        return self._refcounts[block_id] == 0

    def free_block_ids(self) -> list[int]:
        """The free queue, next block to be allocated first."""
        return list(self._free)

    def block_states(self) -> bytes:
        """One `BlockState` byte per block, block id order (a snapshot for dashboards).

        A free block that holds a hash but is not the one indexed under it (a
        duplicate) is FREE: no prefix hit can find it.
        """
        states = bytearray(self.num_blocks)  # all FREE
        for block_id, refcount in enumerate(self._refcounts):
            if refcount:
                states[block_id] = BlockState.USED if refcount == 1 else BlockState.SHARED
        for block_id in self._index.values():
            if self._refcounts[block_id] == 0:
                states[block_id] = BlockState.CACHED
        return bytes(states)

    def lookup(self, block_hash: bytes) -> int | None:
        """The block indexed under `block_hash`, used or cached; None on a miss."""
        return self._index.get(block_hash)

    def indexed_hashes(self) -> list[bytes]:
        """Every hash in the prefix index (used or cached blocks), oldest entry first."""
        return list(self._index)

    def drain_index_events(self) -> tuple[list[bytes], list[bytes]]:
        """(added, removed): the net change of the index since the last call, then reset.

        `added` holds hashes indexed now that were not at the last call, `removed`
        hashes indexed then that are not now (evicted to reuse their block); both
        in order of first change. A hash indexed and evicted in between appears in
        neither, so applying the two lists in any order reproduces the index.
        """
        added = [h for h, was_indexed in self._index_changes.items() if not was_indexed]
        removed = [h for h, was_indexed in self._index_changes.items() if was_indexed]
        self._index_changes.clear()
        return added, removed

    # -------------------------------------------------------------- mutations

    def allocate(self) -> int | None:
        """Pop the least recently freed block (refcount becomes 1); None when empty.

        A cached block loses its hash: its content is about to be overwritten.
        """
        if not self._free:
            return None
        block_id, _ = self._free.popitem(last=False)
        block_hash = self._hashes[block_id]
        if block_hash is not None:
            if self._index.get(block_hash) == block_id:
                del self._index[block_hash]
                self._num_cached -= 1
                self.num_evictions += 1
                self._record_index_change(block_hash, indexed=False)
            self._hashes[block_id] = None
        self._refcounts[block_id] = 1
        return block_id

    def touch(self, block_id: int) -> None:
        """Add a reference; a free (cached) block leaves the free queue."""
        self._check_id(block_id)
        if self._refcounts[block_id] == 0:
            del self._free[block_id]
            if self._is_indexed(block_id):
                self._num_cached -= 1
        self._refcounts[block_id] += 1
        if self._refcounts[block_id] == 2:
            self._num_shared += 1

    def release(self, block_id: int) -> None:
        """Drop a reference; at 0 the block joins the back of the free queue."""
        self._check_id(block_id)
        if self._refcounts[block_id] == 0:
            raise ValueError(f"release: block {block_id} is already free")
        self._refcounts[block_id] -= 1
        if self._refcounts[block_id] == 1:
            self._num_shared -= 1
        elif self._refcounts[block_id] == 0:
            self._free[block_id] = None
            if self._is_indexed(block_id):
                self._num_cached += 1

    def release_tail_first(self, block_table: list[int]) -> list[int]:
        """Release a whole block table, last block first; returns the blocks now free.

        The tail blocks reach the front of the LRU queue first, so they are evicted
        before the prefix blocks that other requests are likelier to hit (vLLM's order).
        """
        freed = []
        for block_id in reversed(block_table):
            self.release(block_id)
            if self._refcounts[block_id] == 0:
                freed.append(block_id)
        return freed

    def register(self, block_id: int, block_hash: bytes) -> bool:
        """Mark a full, written block as holding `block_hash` and index it.

        First writer wins: if another block is already indexed under the hash,
        the index keeps it and this block only records its hash (a duplicate).
        Returns whether the index now maps the hash to this block.
        """
        self._check_id(block_id)
        if self._refcounts[block_id] == 0:
            raise ValueError(f"register: block {block_id} is free")
        stored = self._hashes[block_id]
        if stored is not None and stored != block_hash:
            raise ValueError(f"register: block {block_id} already holds a different hash")
        self._hashes[block_id] = block_hash
        if block_hash not in self._index:
            self._index[block_hash] = block_id
            self._record_index_change(block_hash, indexed=True)
        return self._index[block_hash] == block_id

    def _is_indexed(self, block_id: int) -> bool:
        block_hash = self._hashes[block_id]
        return block_hash is not None and self._index.get(block_hash) == block_id

    def _record_index_change(self, block_hash: bytes, *, indexed: bool) -> None:
        was_indexed = self._index_changes.get(block_hash)
        if was_indexed is None:
            self._index_changes[block_hash] = not indexed
        else:
            # Back to its state at the last drain: no net change to report.
            assert was_indexed == indexed, f"hash {block_hash.hex()} changed state twice"
            del self._index_changes[block_hash]

    # ------------------------------------------------------------- invariants

    def check_integrity(self, counters: bool = True) -> None:
        """Raise AssertionError when the queue, refcounts, index or counters disagree."""
        # Whole-list comparisons first (a pool holds tens of thousands of blocks and tests check
        # after every step); the block-by-block walk only names the first bad block.
        # (The free queue's ids are distinct: as many as the zero refcounts, each at zero, is
        # the same set.)
        free = self._free
        refcounts = self._refcounts
        if (
            min(refcounts, default=0) < 0
            or refcounts.count(0) != len(free)
            or (free and not (min(free) >= 0 and max(free) < self.num_blocks))
            or any(map(refcounts.__getitem__, free))
        ):
            for block_id, refcount in enumerate(refcounts):
                if refcount < 0:
                    raise AssertionError(f"block {block_id} has refcount {refcount}")
                if (refcount == 0) != (block_id in free):
                    raise AssertionError(
                        f"block {block_id} has refcount {refcount} but "
                        f"{'is' if block_id in free else 'is not'} in the free queue"
                    )
            raise AssertionError("the free queue holds a block id outside the pool")
        if len(self._free) + self.num_used_blocks != self.num_blocks:
            raise AssertionError("free + used blocks != total")

        for block_hash, block_id in self._index.items():
            if not 0 <= block_id < self.num_blocks:
                raise AssertionError(f"hash index points at unknown block {block_id}")
            if self._hashes[block_id] != block_hash:
                raise AssertionError(
                    f"hash index maps {block_hash.hex()} to block {block_id}, "
                    "which holds a different hash"
                )
        for block_hash, was_indexed in self._index_changes.items():
            if (block_hash in self._index) == was_indexed:
                raise AssertionError(f"index event for {block_hash.hex()} reports no change")
        # A block holding a hash it is not indexed under is a duplicate: allowed,
        # as long as the index entry (if any) is another block with that hash,
        # which the loop above has checked.
        if counters:
            self.check_counters()

    def check_counters(self) -> None:
        """The running cached/shared counters equal a full recount."""
        cached = sum(1 for b in self._index.values() if self._refcounts[b] == 0)
        if cached != self._num_cached:
            raise AssertionError(f"cached-block counter {self._num_cached} != {cached}")
        shared = sum(map((1).__lt__, self._refcounts))  # refcounts above 1
        if shared != self._num_shared:
            raise AssertionError(f"shared-block counter {self._num_shared} != {shared}")

    def _check_id(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"block_id: {block_id} is not in [0, {self.num_blocks})")
