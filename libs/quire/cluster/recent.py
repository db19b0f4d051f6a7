"""Where this router sent a prompt's blocks in the last seconds, before Redis shows them. Pure.

An executor's prefix set in Redis learns a block only once the executor has it, which can be
seconds after the router sent the prompt (queueing, prefill). Siblings arriving in between (a
burst of one tenant's system prompt, a user's quick next turn) would look like cache misses
and be spread by load, each executor computing the same prefix again. The prefix policy
therefore also counts, per executor, the leading blocks of prompts this router itself routed
there within `ttl_s`; the larger of that and the Redis count is the executor's hit. SGLang's
router keeps a tree of routed prompts for the same reason.

The router leaves it off by default (`--routing-recent-s 0`): an executor computes a prefix
once only if the siblings reach it after that prefill ends, so steering a burst onto one
executor mostly queues it there. docs/benchmarks.md has the simulation that shows it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class RecentRoutes:
    """Block hash -> (executor, expiry) of recently routed prompts, bounded and LRU-ordered."""

    def __init__(self, ttl_s: float = 0.0, max_entries: int = 1 << 16) -> None:
        if ttl_s < 0 or max_entries < 1:
            raise ValueError("ttl_s must be >= 0 and max_entries >= 1")
        self.ttl_s = ttl_s  # how long a route is remembered (0: never)
        self.max_entries = max_entries  # most block hashes held; the oldest go first
        self._routes: OrderedDict[bytes, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._routes)

    def record(self, block_hashes: Sequence[bytes], executor_id: str, now: float) -> None:
        """The prompt with these chained hashes went to `executor_id` at `now`."""
        if not self.ttl_s:
            return
        expiry = now + self.ttl_s
        for h in block_hashes:
            self._routes[h] = (executor_id, expiry)
            self._routes.move_to_end(h)
        while len(self._routes) > self.max_entries:
            self._routes.popitem(last=False)

    def leading_blocks(self, block_hashes: Sequence[bytes], now: float) -> dict[str, int]:
        """Per executor, how many leading blocks of this prompt it was recently sent.

        A chained hash stands for its whole prefix: an executor sent block i was sent blocks
        0..i-1 with it, whoever was sent those later.
        """
        hits: dict[str, int] = {}
        for i, h in enumerate(block_hashes):
            route = self._routes.get(h)
            if route is None or route[1] < now:
                break
            hits[route[0]] = i + 1
        return hits
