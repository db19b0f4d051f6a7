"""Where this router placed prompts lately: each executor's working set, as it sees it. Pure.

A prompt nobody caches is a new prefix (a tenant's context, a conversation's first turn) that
will be reused from wherever it is computed. Consistent hashing alone spreads such prefixes
evenly only on average: with a handful of long contexts per executor, one executor can get
four while its neighbour gets two, and the one with four evicts what nobody else holds.
A cache cluster places new objects by how full each node is (consistent hashing with bounded
loads); a KV cluster must do the same with the blocks its executors will have to keep.

`WorkingSets` remembers, per executor, the distinct block hashes of the prompts this router
sent there in the last `window_s` seconds: an estimate of the blocks that executor is asked to
keep hot. The prefix policy places a cache miss, among executors tied for the least load, on
the one whose working set is the smallest share of its KV cache; the prompt's siblings that
arrive before its executor's prefix set shows it (a tenant's burst) follow it there (`home`).

Each router replica keeps its own view; replicas placing the same new prefix at once may
choose differently, and then both executors compute it, as without placement. Nothing here is
needed for correctness: an executor that never heard of a prompt computes it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class WorkingSets:
    """(executor, block hash) -> when this router last sent that block there, oldest first."""

    def __init__(self, window_s: float = 60.0, max_entries: int = 1 << 18) -> None:
        if window_s < 0 or max_entries < 1:
            raise ValueError("window_s must be >= 0 and max_entries >= 1")
        self.window_s = window_s  # how long a placed block counts (0: placement off)
        self.max_entries = max_entries  # most (executor, block) pairs held; the oldest go first
        self._placed: OrderedDict[tuple[str, bytes], float] = OrderedDict()
        self._num_blocks: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._placed)

    def record(self, block_hashes: Sequence[bytes], executor_id: str, now: float) -> None:
        """The prompt with these chained hashes went to `executor_id` at `now`."""
        if not self.window_s:
            return
        for h in block_hashes:
            key = (executor_id, h)
            if key not in self._placed:
                self._num_blocks[executor_id] = self._num_blocks.get(executor_id, 0) + 1
            self._placed[key] = now
            self._placed.move_to_end(key)
        self._expire(now, keep=self.max_entries)

    def num_blocks(self, executor_id: str, now: float) -> int:
        """Distinct blocks sent to `executor_id` within the window."""
        self._expire(now, keep=self.max_entries)
        return self._num_blocks.get(executor_id, 0)

    def is_home(self, executor_id: str, first_block_hash: bytes, now: float) -> bool:
        """Whether this router sent a prompt opening with this block there within the window."""
        placed = self._placed.get((executor_id, first_block_hash))
        return placed is not None and placed >= now - self.window_s

    def _expire(self, now: float, keep: int) -> None:
        horizon = now - self.window_s
        while self._placed:
            (executor_id, h), placed = next(iter(self._placed.items()))
            if placed >= horizon and len(self._placed) <= keep:
                return
            del self._placed[(executor_id, h)]
            self._num_blocks[executor_id] -= 1
