"""HostBlockPool: copies of full, committed KV blocks in host memory, keyed by block hash.

The key is the block's chained hash (quire.block.hashing, extra key included): the same
key the prefix index uses, so equal keys mean equal token prefixes and therefore equal KV.
Two sequences that share a block (n > 1 forks, a common system prompt) store it once.

Capacity is in bytes (`--swap-space` GiB); adding past it evicts the least recently used
blocks (a `get` counts as a use). A capacity of 0 holds nothing: every `put` is refused.
Only full blocks whose tokens are all computed may be stored; the pool cannot check that
and trusts its caller (quire.engine.swap).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class HostPoolStats:
    """The pool's occupancy and its lifetime counters."""

    capacity_bytes: int
    num_bytes_used: int
    num_blocks: int
    num_puts: int  # blocks stored
    num_evictions: int  # blocks dropped to make room

    @property
    def usage(self) -> float:
        """Fraction 0..1 of the capacity in use (0 for a disabled pool)."""
        return self.num_bytes_used / self.capacity_bytes if self.capacity_bytes else 0.0


class HostBlockPool:
    """An LRU map from block hash to one block's KV (a CPU tensor), bounded in bytes."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes: must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # oldest use first
        self._num_bytes_used = 0
        self._num_puts = 0
        self._num_evictions = 0

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def num_bytes_used(self) -> int:
        return self._num_bytes_used

    def can_hold(self, num_bytes: int) -> bool:
        """Whether one block of `num_bytes` fits in the pool at all (after evictions)."""
        return 0 < num_bytes <= self.capacity_bytes

    def put(self, block_hash: bytes, block: torch.Tensor) -> bool:
        """Store `block` (a CPU tensor this pool now owns; do not mutate it) under its hash.

        A hash already held is only marked used (its bytes are the same by construction).
        Evicts least recently used blocks to make room. False if the block cannot fit.
        """
        if block_hash in self._blocks:
            self._blocks.move_to_end(block_hash)
            return True
        num_bytes = _num_bytes(block)
        if not self.can_hold(num_bytes):
            return False
        assert block.device.type == "cpu", f"host blocks live on the CPU, got {block.device}"
        while self._num_bytes_used + num_bytes > self.capacity_bytes:
            _, evicted = self._blocks.popitem(last=False)
            self._num_bytes_used -= _num_bytes(evicted)
            self._num_evictions += 1
        self._blocks[block_hash] = block
        self._num_bytes_used += num_bytes
        self._num_puts += 1
        return True

    def touch(self, block_hash: bytes) -> bool:
        """Mark a held block as just used (a later put of it would be a no-op); False if absent."""
        if block_hash not in self._blocks:
            return False
        self._blocks.move_to_end(block_hash)
        return True

    def get(self, block_hash: bytes) -> torch.Tensor | None:
        """The block stored under `block_hash` (now the most recently used), or None."""
        block = self._blocks.get(block_hash)
        if block is not None:
            self._blocks.move_to_end(block_hash)
        return block

    def stats(self) -> HostPoolStats:
        return HostPoolStats(
            capacity_bytes=self.capacity_bytes,
            num_bytes_used=self._num_bytes_used,
            num_blocks=len(self._blocks),
            num_puts=self._num_puts,
            num_evictions=self._num_evictions,
        )


def _num_bytes(block: torch.Tensor) -> int:
    return block.numel() * block.element_size()
