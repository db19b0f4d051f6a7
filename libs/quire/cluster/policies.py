"""The router's routing policies behind one interface. Pure, no I/O.

Every policy gets the same inputs for one prompt: the live executors as `Candidate`s (their
record, this router's in-flight count, and, for policies that ask for it, the prompt's leading
blocks in each one's prefix cache), the prompt's chained block hashes and token ids, and the
executors it must not pick (down, at their admission bound, already tried). It returns one
`RoutingDecision` or None when nobody may take the prompt. Admission and retries are the
dispatcher's, the same for every policy.

``round-robin``   executors in id order, one after another; skips excluded ones.
``least-loaded``  fewest queued requests (the record's running + waiting, or this router's own
                  in-flight count when higher), then lowest KV usage; ties rotate.
``hash``          a consistent hash ring (uhashring: md5 points) over the executor ids, keyed
                  by the prompt's first block hash: what an approximate, index-free router does.
                  An excluded owner passes the prompt to the next executor on the ring.
``prefix``        the precise policy (`quire.cluster.routing.choose_executor`): the executor
                  holding the longest cached prefix, weighed against load, capped when the
                  holder is saturated; prompts nobody caches go to the least loaded executor.
                  Prefixes this router routed in the last seconds count as held by their
                  executor before its Redis set shows them (`quire.cluster.recent`), and new
                  prefixes go where the recent working set leaves most room
                  (`quire.cluster.placement`).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

from uhashring import HashRing

from quire.cluster.placement import WorkingSets
from quire.cluster.recent import RecentRoutes
from quire.cluster.routing import (
    Candidate,
    RoutingConfig,
    RoutingDecision,
    choose_executor,
    routing_key,
)

POLICY_NAMES = ("prefix", "round-robin", "least-loaded", "hash")
DEFAULT_POLICY = "prefix"
RING_VNODES = 160  # ring points per executor (uhashring's default)


@dataclass(frozen=True)
class RoutingRequest:
    """One prompt as the policies see it."""

    prompt_token_ids: Sequence[int]
    block_hashes: Sequence[bytes]  # chained full-block hashes under `block_size`
    block_size: int  # tokens per block, to turn cached blocks into cached tokens
    now: float = 0.0  # monotonic seconds at routing time (for remembered routes)


class RoutingPolicy(Protocol):
    """Picks an executor for one prompt."""

    name: ClassVar[str]  # what --routing-policy calls it
    uses_prefix_cache: ClassVar[bool]  # candidates need `num_cached_blocks` (a Redis round trip)

    def choose(
        self,
        candidates: Sequence[Candidate],
        request: RoutingRequest,
        exclude: Collection[str] = (),
    ) -> RoutingDecision | None: ...


def eligible(candidates: Sequence[Candidate], exclude: Collection[str]) -> list[Candidate]:
    """Candidates that may take work, in executor-id order."""
    usable = [c for c in candidates if not c.record.draining and c.executor_id not in exclude]
    return sorted(usable, key=lambda c: c.executor_id)


def _decision(c: Candidate, reason: str) -> RoutingDecision:
    return RoutingDecision(c.executor_id, c.record.address, reason, 0)


class RoundRobinPolicy:
    """Each prompt to the next executor in id order, whatever it holds or runs."""

    name: ClassVar[str] = "round-robin"
    uses_prefix_cache: ClassVar[bool] = False

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(
        self,
        candidates: Sequence[Candidate],
        request: RoutingRequest,
        exclude: Collection[str] = (),
    ) -> RoutingDecision | None:
        everyone = sorted(
            (c for c in candidates if not c.record.draining), key=lambda c: c.executor_id
        )
        if not everyone:
            return None
        # The turn walks the whole list, so an excluded executor keeps its place in the cycle.
        start = next(self._turn) % len(everyone)
        for offset in range(len(everyone)):
            c = everyone[(start + offset) % len(everyone)]
            if c.executor_id not in exclude:
                return _decision(c, "round_robin")
        return None


class LeastLoadedPolicy:
    """The executor with the fewest queued requests, then the lowest KV usage."""

    name: ClassVar[str] = "least-loaded"
    uses_prefix_cache: ClassVar[bool] = False

    def __init__(self) -> None:
        self._ties = itertools.count()

    def choose(
        self,
        candidates: Sequence[Candidate],
        request: RoutingRequest,
        exclude: Collection[str] = (),
    ) -> RoutingDecision | None:
        open_ = eligible(candidates, exclude)
        if not open_:
            return None
        best = min((c.load, c.kv_usage) for c in open_)
        tied = [c for c in open_ if (c.load, c.kv_usage) == best]
        # Rotating among equals: an idle cluster spreads its first requests instead of
        # sending them all to the lowest id.
        return _decision(tied[next(self._ties) % len(tied)], "least_loaded")


class ConsistentHashPolicy:
    """A hash ring over executor ids, keyed by the first block hash (no index, no load)."""

    name: ClassVar[str] = "hash"
    uses_prefix_cache: ClassVar[bool] = False

    def __init__(self, vnodes: int = RING_VNODES) -> None:
        self.vnodes = vnodes
        self._ring: HashRing | None = None
        self._ring_ids: frozenset[str] = frozenset()

    def ring(self, executor_ids: Collection[str]) -> HashRing:
        """The ring over these executors (rebuilt only when the set changes)."""
        ids = frozenset(executor_ids)
        if self._ring is None or ids != self._ring_ids:
            self._ring = HashRing(nodes={e: {"vnodes": self.vnodes} for e in sorted(ids)})
            self._ring_ids = ids
        return self._ring

    def owners(self, key: bytes, executor_ids: Collection[str]) -> list[str]:
        """Every executor in ring order from the key's point: the owner first."""
        if not executor_ids:
            return []
        nodes = self.ring(executor_ids).range(key.hex(), size=len(executor_ids), unique=True)
        return [str(node["nodename"]) for node in nodes]

    def choose(
        self,
        candidates: Sequence[Candidate],
        request: RoutingRequest,
        exclude: Collection[str] = (),
    ) -> RoutingDecision | None:
        # The ring spans every executor that takes work, so a temporarily excluded one (full,
        # tried) does not reshuffle everybody else's keys.
        by_id = {c.executor_id: c for c in candidates if not c.record.draining}
        key = routing_key(request.block_hashes, request.prompt_token_ids)
        for executor_id in self.owners(key, by_id):
            if executor_id not in exclude:
                return _decision(by_id[executor_id], "hash_ring")
        return None


class PrefixPolicy:
    """Longest cached prefix weighed against load (`choose_executor`)."""

    name: ClassVar[str] = "prefix"
    uses_prefix_cache: ClassVar[bool] = True

    def __init__(
        self,
        config: RoutingConfig | None = None,
        recent: RecentRoutes | None = None,
        placement: WorkingSets | None = None,
    ) -> None:
        self.config = config or RoutingConfig()
        self.recent = recent if recent is not None else RecentRoutes()
        self.placement = placement if placement is not None else WorkingSets()

    def choose(
        self,
        candidates: Sequence[Candidate],
        request: RoutingRequest,
        exclude: Collection[str] = (),
    ) -> RoutingDecision | None:
        routed = self.recent.leading_blocks(request.block_hashes, request.now)
        if routed:
            candidates = [
                replace(c, num_cached_blocks=max(c.num_cached_blocks, routed[c.executor_id]))
                if c.executor_id in routed
                else c
                for c in candidates
            ]
        if request.block_hashes and self.placement.window_s:
            first = request.block_hashes[0]
            candidates = [
                replace(
                    c,
                    num_placed_blocks=self.placement.num_blocks(c.executor_id, request.now),
                    is_home=self.placement.is_home(c.executor_id, first, request.now),
                )
                for c in candidates
            ]
        decision = choose_executor(
            candidates,
            request.block_hashes,
            request.prompt_token_ids,
            self.config,
            exclude,
            block_size=request.block_size,
        )
        if decision is not None:
            self.recent.record(request.block_hashes, decision.executor_id, request.now)
            self.placement.record(request.block_hashes, decision.executor_id, request.now)
        return decision


def make_policy(
    name: str,
    config: RoutingConfig | None = None,
    recent: RecentRoutes | None = None,
    placement: WorkingSets | None = None,
) -> RoutingPolicy:
    """The policy called `name` (one of POLICY_NAMES); the other arguments tune `prefix`."""
    if name == "prefix":
        return PrefixPolicy(config, recent, placement)
    if name == "round-robin":
        return RoundRobinPolicy()
    if name == "least-loaded":
        return LeastLoadedPolicy()
    if name == "hash":
        return ConsistentHashPolicy()
    raise ValueError(f"unknown routing policy {name!r}; one of {', '.join(POLICY_NAMES)}")
