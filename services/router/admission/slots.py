"""Admission control: bounded in-flight executor requests, per executor and overall.

Everything runs on one event loop, so a check followed by `acquire` with no `await` in
between cannot be raced. A request past a bound is refused at once (HTTP 429 with
Retry-After) rather than queued: queues belong in the executors, where they are bounded by
KV memory, and a client can back off or try another router replica.

Admission is decided at the door. A generation request takes a `Ticket` before its body is
parsed (`admission.door`); a ticket holds one place under the overall bound while the
request is validated, tokenized and routed, and turns into its first executor slot. So when
a slot frees, one waiting request gets it instead of many passing the door and all but one
being refused after doing that work.
"""

from __future__ import annotations

from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class Ticket:
    """A place under the overall bound, held from the door until the first executor slot."""

    held: bool = True


ALL_EXECUTORS_FULL = "every live executor is at its admission bound; retry later"

# The current request's ticket: set at the door, consumed by the dispatcher.
current_ticket: ContextVar[Ticket | None] = ContextVar("quire_admission_ticket", default=None)


class Admission:
    """Counts in-flight executor requests; one request with k prompts holds k slots."""

    def __init__(self, max_pending_per_executor: int, max_pending_total: int) -> None:
        if max_pending_per_executor < 1 or max_pending_total < 1:
            raise ValueError("admission bounds must be >= 1")
        self.max_pending_per_executor = max_pending_per_executor
        self.max_pending_total = max_pending_total
        self.num_pending = 0
        self.num_entering = 0  # tickets: requests past the door, not yet holding a slot
        self._per_executor: Counter[str] = Counter()

    def pending(self, executor_id: str) -> int:
        return self._per_executor[executor_id]

    @property
    def num_taken(self) -> int:
        """Places taken under the overall bound: slots and tickets."""
        return self.num_pending + self.num_entering

    def enter(self) -> Ticket | None:
        """A ticket for one more request, or None when the overall bound is reached."""
        if self.num_taken >= self.max_pending_total:
            return None
        self.num_entering += 1
        return Ticket()

    def leave(self, ticket: Ticket) -> None:
        """Give back a ticket that never became a slot (the request failed or was refused)."""
        if ticket.held:
            ticket.held = False
            self.num_entering -= 1

    def overall_full_message(self) -> str:
        """What a request refused at the overall bound is told."""
        return (
            f"the router has {self.num_taken} requests in flight or entering "
            f"(limit {self.max_pending_total}); retry later"
        )

    def can_admit(self, num_requests: int = 1, ticket: Ticket | None = None) -> bool:
        """True when `num_requests` more fit under the overall bound (a ticket counts as one)."""
        own = 1 if ticket is not None and ticket.held else 0
        return self.num_taken - own + num_requests <= self.max_pending_total

    def full_executors(self) -> set[str]:
        """Executors at their own bound: routing must not pick them."""
        return {e for e, n in self._per_executor.items() if n >= self.max_pending_per_executor}

    def try_acquire(self, executor_id: str, ticket: Ticket | None = None) -> bool:
        """Take one slot on `executor_id`, turning a held ticket into it; False (and nothing
        taken) when a bound is reached."""
        use_ticket = ticket is not None and ticket.held
        if not use_ticket and self.num_taken >= self.max_pending_total:
            return False
        if self._per_executor[executor_id] >= self.max_pending_per_executor:
            return False
        if ticket is not None and use_ticket:
            ticket.held = False
            self.num_entering -= 1
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
