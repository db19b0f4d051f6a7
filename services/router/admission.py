"""Admission control: bounded in-flight executor requests, per executor and overall.

Everything runs on one event loop, so a check followed by `acquire` with no `await` in
between cannot be raced. A request past a bound is refused at once (HTTP 429 with
Retry-After) rather than queued: queues belong in the executors, where they are bounded by
KV memory, and a client can back off or try another router replica.
"""

from __future__ import annotations

from collections import Counter


class Admission:
    """Counts in-flight executor requests; one request with k prompts holds k slots."""

    def __init__(self, max_pending_per_executor: int, max_pending_total: int) -> None:
        if max_pending_per_executor < 1 or max_pending_total < 1:
            raise ValueError("admission bounds must be >= 1")
        self.max_pending_per_executor = max_pending_per_executor
        self.max_pending_total = max_pending_total
        self.num_pending = 0
        self._per_executor: Counter[str] = Counter()

    def pending(self, executor_id: str) -> int:
        return self._per_executor[executor_id]

    def can_admit(self, num_requests: int = 1) -> bool:
        """True when `num_requests` more fit under the overall bound."""
        return self.num_pending + num_requests <= self.max_pending_total

    def full_executors(self) -> set[str]:
        """Executors at their own bound: routing must not pick them."""
        return {e for e, n in self._per_executor.items() if n >= self.max_pending_per_executor}

    def try_acquire(self, executor_id: str) -> bool:
        """Take one slot on `executor_id`; False (and nothing taken) when a bound is reached."""
        if self.num_pending >= self.max_pending_total:
            return False
        if self._per_executor[executor_id] >= self.max_pending_per_executor:
            return False
        self.num_pending += 1
        self._per_executor[executor_id] += 1
        return True

    def release(self, executor_id: str) -> None:
        """Give back a slot taken by `try_acquire`."""
        assert self._per_executor[executor_id] > 0, f"release without acquire on {executor_id}"
        self.num_pending -= 1
        self._per_executor[executor_id] -= 1
        if not self._per_executor[executor_id]:
            del self._per_executor[executor_id]
