"""Pulls between executors: which peer holds an admitted prompt's next blocks, and the pins.

The memory manager sees every registered executor's pool, so after an executor's step admits a
prompt it can tell where the prompt's next full blocks (past the executor's own prefix hits)
are already computed: on a peer whose pool indexes their chained hashes. It offers the longest
such run one peer holds (`quire.block.allocator.PullOffer`) and pins those blocks in the peer's
pool (a reference each), so the peer can neither evict nor reuse them while the destination
copies their KV from it, executor to executor.

A pin ends when the destination releases it (in a later step, whether it pulled or gave up),
when its lease runs out (the destination died or hung), or with either executor's incarnation:
a source that re-registers or leaves takes its pool, and the pins on it, with it; a destination
that does leaves pins nobody will release, which are dropped. A manager restart loses every
pin; the offer names the manager instance that granted it, so a source never serves a read
under a pin the current manager does not hold.

No gRPC here: the servicer runs each executor's step through `step` (release, expire, the
pool's step, offers) and calls `forget_executor` when an incarnation is replaced or leaves.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quire.block.allocator import AdmitRequest, PullOffer, StepAllocation, StepAllocationResult
from quire.block.hashing import hash_full_blocks
from services.memory_manager.pools import ExecutorPool, ExecutorPools


@dataclass(frozen=True)
class Pin:
    """References held on a source pool's blocks for one offered pull."""

    source_id: str
    source_epoch: int
    block_ids: tuple[int, ...]
    destination_id: str
    destination_epoch: int
    expires_at: float  # on the broker's clock


@dataclass
class PullCounters:
    """Lifetime counts, for the manager's metrics."""

    num_offers: int = 0
    num_blocks_offered: int = 0
    num_released: int = 0
    num_expired: int = 0


class PullBroker:
    """Offers peers' blocks to admitted prompts and holds the pins until they are released."""

    def __init__(
        self,
        pools: ExecutorPools,
        granted_by: str,
        lease_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s: must be > 0, got {lease_s}")
        self.pools = pools
        self.granted_by = granted_by  # this manager instance's id
        self.lease_s = lease_s
        self.clock = clock
        self.pins: dict[str, Pin] = {}
        self.counters = PullCounters()

    def step(self, pool: ExecutorPool, request: StepAllocation) -> StepAllocationResult:
        """One executor's allocator step with pulls: its released pins dropped first (and
        every expired one), then its pool's step, then offers for what it admitted."""
        self.release(request.released_pins)
        self.expire()
        result = pool.manager.step(request)
        self.offer(pool, request.admits, result)
        return result

    def offer(
        self,
        destination: ExecutorPool,
        admits: Sequence[AdmitRequest],
        result: StepAllocationResult,
    ) -> None:
        """Fill `result.pulls` for the admitted prompts a peer can serve (see the module)."""
        if not destination.accepts_pulls or not destination.manager.enable_prefix_caching:
            return
        block_size = destination.manager.block_size
        peers = [
            p
            for p in self.pools
            if p.executor_id != destination.executor_id
            and p.manager.block_size == block_size
            and p.manager.layout == destination.manager.layout
            and p.manager.enable_prefix_caching
        ]
        if not peers:
            return
        for admit in admits:
            num_cached = result.num_cached_tokens.get(admit.seq_id)
            if num_cached is None or admit.skip_prefix_cache:
                continue  # not admitted, or it needs every position computed
            first = num_cached // block_size
            # As for local hits, the block holding the last token is always computed.
            last = (len(admit.token_ids) - 1) // block_size
            if first >= last:
                continue
            hashes = hash_full_blocks(
                admit.token_ids[: last * block_size], block_size, admit.extra_key
            )
            wanted = hashes[first:]
            source, run = max(((p, _leading_run(p, wanted)) for p in peers), key=lambda x: x[1])
            if run == 0:
                continue
            block_ids = source.manager.pin(wanted[:run])
            assert len(block_ids) == run * source.manager.num_groups, "the run was just looked up"
            pin_id = uuid.uuid4().hex
            self.pins[pin_id] = Pin(
                source.executor_id,
                source.epoch,
                tuple(block_ids),
                destination.executor_id,
                destination.epoch,
                self.clock() + self.lease_s,
            )
            result.pulls[admit.seq_id] = PullOffer(
                pin_id=pin_id,
                source_executor_id=source.executor_id,
                source_address=source.address,
                granted_by=self.granted_by,
                first_block=first,
                source_block_ids=tuple(block_ids),
            )
            self.counters.num_offers += 1
            self.counters.num_blocks_offered += run

    def release(self, pin_ids: Sequence[str]) -> None:
        """The destination is done with these pins; unknown ones (expired, or granted by an
        earlier manager instance) are ignored."""
        for pin_id in pin_ids:
            pin = self.pins.pop(pin_id, None)
            if pin is not None:
                self._unpin(pin)
                self.counters.num_released += 1

    def expire(self) -> None:
        """Drop pins whose lease ran out (their destination never released them)."""
        now = self.clock()
        for pin_id, pin in list(self.pins.items()):
            if pin.expires_at <= now:
                del self.pins[pin_id]
                self._unpin(pin)
                self.counters.num_expired += 1

    def forget_executor(self, executor_id: str, epoch: int) -> None:
        """An incarnation was replaced or left: its pins as a source went with its pool; its
        pins as a destination will never be released."""
        for pin_id, pin in list(self.pins.items()):
            if (pin.source_id, pin.source_epoch) == (executor_id, epoch):
                del self.pins[pin_id]  # the pool holding the references is gone
            elif (pin.destination_id, pin.destination_epoch) == (executor_id, epoch):
                del self.pins[pin_id]
                self._unpin(pin)

    def _unpin(self, pin: Pin) -> None:
        source = self.pools.find(pin.source_id)
        if source is not None and source.epoch == pin.source_epoch:
            source.manager.unpin(pin.block_ids)


def _leading_run(pool: ExecutorPool, block_hashes: Sequence[bytes]) -> int:
    """How many of the logical blocks `block_hashes`, from the first, `pool` indexes (every
    KV group's block of each)."""
    return len(pool.manager.lookup_prefix(block_hashes)) // pool.manager.num_groups
