"""The prefixes an engine computed lately: a waiting prompt's likely prefix hits, before admission.

Shortest-first (quire.engine.scheduler) orders prompts by the prefill they still need. A
waiting prompt's prefix hits are known only once the allocator admits it, and a conversation's
next turn is mostly its earlier turns, which the router sends back to the executor that holds
them: by its whole length such a prompt would wait behind every newer short one. So the
scheduler records the chained hashes (quire.block.hashing) of the full blocks its sequences
computed, the latest RecentPrefixes.capacity of them, and counts a waiting prompt's leading
blocks found there as cached. It is an estimate for the order only: the allocator may have
evicted those blocks since, and then the prompt computes them, in a chunk of the step's plan
and the rest in the next step.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from quire.block.hashing import extend_block_hashes
from quire.engine.sequence import Sequence


@dataclass
class RecentPrefixes:
    """Hashes of the full blocks computed lately, oldest first, at most `capacity`."""

    block_size: int
    extra_key: str = ""
    capacity: int = 1 << 16
    _hashes: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    def record(self, seq: Sequence) -> None:
        """`seq`'s full blocks of computed tokens, the ones not recorded before."""
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_recorded_blocks:
            return
        hashes = self._block_hashes(seq, num_full)
        for block_hash in hashes[seq.num_recorded_blocks : num_full]:
            self._hashes[block_hash] = None
            self._hashes.move_to_end(block_hash)
        seq.num_recorded_blocks = num_full
        while len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)

    def cached_tokens(self, seq: Sequence) -> int:
        """How many of `seq`'s leading tokens are full blocks recorded here (at most all but
        its last token, which is always computed)."""
        if not self._hashes:
            return 0
        num_cached = 0
        for block_hash in self._block_hashes(seq, seq.num_tokens // self.block_size):
            if block_hash not in self._hashes:
                break
            num_cached += 1
        return min(num_cached * self.block_size, seq.num_tokens - 1)

    def _block_hashes(self, seq: Sequence, num_full: int) -> list[bytes]:
        """The hashes of `seq`'s first `num_full` full blocks, extended on `seq` as needed."""
        if len(seq.block_hashes) < num_full:
            extend_block_hashes(
                seq.block_hashes,
                seq.token_ids[: num_full * self.block_size],
                self.block_size,
                self.extra_key,
            )
        return seq.block_hashes
