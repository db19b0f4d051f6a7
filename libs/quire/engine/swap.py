"""Preemption by swapping: a preempted sequence's KV goes to host memory and comes back.

The allocator (in process or the memory manager) does not know about swapping: it preempts
as always, freeing the sequence's blocks and naming it in `StepAllocationResult.preempted`.
Swapping is the executor's, which owns the bytes:

- **Out.** In the step that preempted it, before that step's block copies and forward pass
  (either may overwrite the freed blocks, which the same result can hand to others), the
  engine gives `swap_out` the sequence's full computed blocks from its table as it was
  before the step (`SchedulerOutput.preempted_blocks`). Their KV is read in one
  `PagedKVCache.read_blocks` call into the `HostBlockPool`, keyed by chained block hash;
  blocks the pool already holds (an n > 1 fork's shared prompt) are not read again.
- **In.** When the scheduler re-admits the sequence, the allocator gives it a table and its
  device prefix hits. The scheduler asks `load_prefix` for more: the leading full blocks
  after the hits whose hashes the host pool holds are written into the new blocks in one
  `write_blocks` call and count as computed tokens the engine did not compute (as prefix
  hits do; never the last token, which is always recomputed). The next commit registers
  their hashes in the prefix index like any computed block. The partial tail and every
  block the pool lacks (evicted, or never full) are recomputed.

No admission happens in a step that preempted (quire.block.allocator), so a swap-out and a
swap-in never meet in one step.

With several KV groups (a hybrid model's tables, quire.block.window.TableLayout) a logical
block is one table entry per group: the host pool keeps the entries of a logical block as one
buffer under its hash, and a logical block with a released (sliding) entry is not swapped.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quire.block.hashing import hash_full_blocks
from quire.block.window import RELEASED_BLOCK
from quire.cache.host_pool import HostBlockPool
from quire.cache.paged_kv import PagedKVCache
from quire.engine.stats import SwapStats


class KVSwapper:
    """Moves preempted sequences' full blocks between the paged KV cache and a host pool."""

    def __init__(self, kv: PagedKVCache, host_pool: HostBlockPool, extra_key: str) -> None:
        self.kv = kv
        self.num_groups = kv.groups.num_groups  # table entries per logical block
        self.host_pool = host_pool
        self.extra_key = extra_key  # mixed into block hashes, as the scheduler's admits do
        # Lifetime block counts: swapped out, loaded in, missed (looked for, recomputed).
        self._num_out = self._num_in = self._num_missed = 0
        self._step_start = (0, 0, 0)  # the counts when the current step began

    def swap_out(self, token_ids: Sequence[int], block_ids: Sequence[int]) -> int:
        """Copy a preempted sequence's full computed blocks to the host pool.

        `block_ids` are its table's first entries (every group's of each logical block), every
        block full of computed tokens of `token_ids`, whose KV is still intact (before this
        step's copies and forward pass); blocks with a slot released outside a sliding window
        are skipped (a resume loads the leading run the host pool holds, so it recomputes from
        the first of them the device lost). Returns the number of table entries read (blocks
        the pool held already are only touched).
        """
        groups = self.num_groups
        if not block_ids or not self.host_pool.can_hold(groups * self.kv.bytes_per_block):
            return 0
        bs = self.kv.block_size
        entries = [tuple(block_ids[i : i + groups]) for i in range(0, len(block_ids), groups)]
        hashes = hash_full_blocks(token_ids[: len(entries) * bs], bs, self.extra_key)
        assert len(hashes) == len(entries), "only full blocks are swapped"
        wanted = [
            (h, ids)
            for h, ids in zip(hashes, entries, strict=True)
            if RELEASED_BLOCK not in ids and not self.host_pool.touch(h)
        ]
        if not wanted:
            return 0
        # buffer: [len(wanted), groups, num_slots, planes, block_size, heads, head_dim] on the
        # host
        buffer = self.kv.read_blocks([b for _, ids in wanted for b in ids])
        buffer = buffer.view(len(wanted), groups, *buffer.shape[1:])
        # Earliest blocks put last (most recently used): a resume loads a leading run and stops
        # at the first block the pool lacks, so if this overflows the pool, the earliest stay.
        for i in reversed(range(len(wanted))):
            self.host_pool.put(wanted[i][0], buffer[i].clone())
        self._num_out += len(wanted) * groups
        return len(wanted) * groups

    def load_prefix(
        self, token_ids: Sequence[int], block_ids: Sequence[int], num_cached_tokens: int
    ) -> int:
        """Write the host pool's copies of a resumed sequence's next full blocks into its table.

        `block_ids` is the table the allocator just granted for `token_ids`, whose first
        `num_cached_tokens` (whole blocks) are device prefix hits. Loads the leading run of
        following full blocks the pool holds, stopping before the block of the last token.
        Returns the tokens loaded (a multiple of the block size; 0 if none).
        """
        groups = self.num_groups
        bs = self.kv.block_size
        first = num_cached_tokens // bs
        assert first * bs == num_cached_tokens, "prefix hits are whole blocks"
        end = (len(token_ids) - 1) // bs  # the last token's block is always recomputed
        if end <= first:
            return 0
        hashes = hash_full_blocks(token_ids[: end * bs], bs, self.extra_key)
        found = []
        for index in range(first, end):
            block = self.host_pool.get(hashes[index])
            if block is None:
                break
            found.append(block)
        self._num_missed += (end - first - len(found)) * groups
        if not found:
            return 0
        data = torch.stack(found)  # [n, groups, num_slots, ...]
        data = data.view(len(found) * groups, *data.shape[2:])
        self.kv.write_blocks(block_ids[first * groups : (first + len(found)) * groups], data)
        self._num_in += len(found) * groups
        return len(found) * bs

    def step_stats(self) -> SwapStats:
        """What moved since the previous call (one engine step), and the pool after it."""
        now = (self._num_out, self._num_in, self._num_missed)
        out0, in0, missed0 = self._step_start
        self._step_start = now
        return self._stats(now[0] - out0, now[1] - in0, now[2] - missed0)

    def total_stats(self) -> SwapStats:
        """Everything moved since the engine started, and the pool now."""
        return self._stats(self._num_out, self._num_in, self._num_missed)

    def _stats(self, out: int, into: int, missed: int) -> SwapStats:
        pool = self.host_pool.stats()
        per_block = self.kv.bytes_per_block
        return SwapStats(
            num_blocks_out=out,
            num_blocks_in=into,
            num_blocks_missed=missed,
            num_bytes_out=out * per_block,
            num_bytes_in=into * per_block,
            host_bytes_used=pool.num_bytes_used,
            host_bytes_capacity=pool.capacity_bytes,
        )
