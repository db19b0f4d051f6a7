"""PrefixPublisher: mirrors executors' prefix indexes into Redis, off the Step path.

Each executor incarnation owns one Redis SET of raw 16-byte block hashes at
`prefix_key(prefix, executor_id, epoch)` (see quire.cluster.redis_keys). The memory
manager calls `reset` on Register, `publish` after every Step (the index events of
`BlockManager.drain_index_events`) and `drop` on Deregister. Those calls are
synchronous and only update an in-memory mirror; a background task writes the
changes, coalesced, in one MULTI/EXEC pipeline per round:

- new keys and keys of a replaced incarnation: DEL, then SADD of every hash;
- known keys: SADD of added hashes, SREM of removed ones;
- every key: EXPIRE `PREFIX_TTL_S`, refreshed every `refresh_s` while it lives;
- dropped keys (deregistered, or an executor's previous epoch): DEL.

Redis being down never reaches the caller: a failed round is logged and retried
with backoff, and the first round that succeeds afterwards republishes every key
from scratch (DEL + SADD of the whole mirror). A key that vanished while Redis
looked healthy (a restart between two rounds, an eviction) is noticed by its
EXPIRE returning 0 and rewritten the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
import structlog

from quire.cluster.redis_keys import PREFIX_TTL_S, prefix_key
from services.common import redis_client

log = structlog.get_logger(__name__)

# How long one Redis call of the publisher may take (connecting: half of it) before it gives up.
REDIS_TIMEOUT_S = 2.0
_MAX_ARGS = 8192  # hashes per SADD when rewriting a whole key (large pools)


@dataclass
class _Delta:
    """Changes to one key not yet written (disjoint sets)."""

    added: set[bytes] = field(default_factory=set)
    removed: set[bytes] = field(default_factory=set)


@dataclass
class _Round:
    """What one pipeline writes, snapshotted before the await."""

    deletes: list[str]
    rewrites: dict[str, list[bytes]]
    deltas: dict[str, _Delta]
    refresh: list[str]
    # Keys of rewrites and deltas -> whether the key holds anything once written.
    exists_after: dict[str, bool]


class PrefixPublisher:
    """Keeps `{prefix}:prefix:{executor}:{epoch}` sets equal to the managers' indexes."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str = "quire",
        *,
        ttl_s: float = PREFIX_TTL_S,
        refresh_s: float = 5.0,
        min_backoff_s: float = 0.1,
        max_backoff_s: float = 2.0,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.refresh_s = refresh_s
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.is_healthy = True  # False from a failed round until one succeeds
        self.num_failed_rounds = 0
        # key -> every hash it should hold (the mirror; empty sets are absent in Redis).
        self._desired: dict[str, set[bytes]] = {}
        self._key_of: dict[str, str] = {}  # executor id -> its current key
        self._deltas: dict[str, _Delta] = {}
        self._rewrites: set[str] = set()
        self._deletes: set[str] = set()
        self._written: set[str] = set()  # keys known to exist in Redis (non-empty)
        self._in_flight = False  # a round has been taken and is being written
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_refresh = time.monotonic()

    @classmethod
    def from_url(cls, url: str, prefix: str = "quire", **kwargs: float) -> PrefixPublisher:
        """A publisher with its own client: short timeouts and no retries inside the
        client (a dead Redis fails the round fast; the publisher's loop retries)."""
        client = redis_client.connect(
            url,
            timeout_s=REDIS_TIMEOUT_S,
            connect_timeout_s=REDIS_TIMEOUT_S / 2,
            client_retries=False,
        )
        return cls(client, prefix, **kwargs)

    # ------------------------------------------------------ the caller's side

    def reset(self, executor_id: str, epoch: int, hashes: Iterable[bytes]) -> None:
        """The executor (re)registered: its key holds exactly `hashes`; an older epoch's key goes."""
        key = prefix_key(self.prefix, executor_id, epoch)
        old = self._key_of.get(executor_id)
        if old is not None and old != key:
            self._drop_key(old)
        self._key_of[executor_id] = key
        self._desired[key] = set(hashes)
        self._deltas.pop(key, None)
        self._deletes.discard(key)
        self._rewrites.add(key)
        self._kick()

    def publish(
        self, executor_id: str, epoch: int, added: Iterable[bytes], removed: Iterable[bytes]
    ) -> None:
        """Apply one step's index events (disjoint lists) to the executor's key."""
        key = prefix_key(self.prefix, executor_id, epoch)
        desired = self._desired.get(key)
        if desired is None:
            raise ValueError(f"publish: {key!r} was never reset (register the executor first)")
        added, removed = list(added), list(removed)
        if not added and not removed:
            return
        desired.update(added)
        desired.difference_update(removed)
        if key not in self._rewrites:
            delta = self._deltas.setdefault(key, _Delta())
            delta.removed.difference_update(added)
            delta.added.update(added)
            delta.added.difference_update(removed)
            delta.removed.update(removed)
        self._kick()

    def drop(self, executor_id: str, epoch: int) -> None:
        """The executor incarnation is gone: delete its key."""
        key = prefix_key(self.prefix, executor_id, epoch)
        if self._key_of.get(executor_id) == key:
            del self._key_of[executor_id]
        self._drop_key(key)
        self._kick()

    def hashes(self, executor_id: str, epoch: int) -> set[bytes]:
        """A copy of what the key should hold (the mirror)."""
        return set(self._desired.get(prefix_key(self.prefix, executor_id, epoch), ()))

    def _drop_key(self, key: str) -> None:
        self._desired.pop(key, None)
        self._deltas.pop(key, None)
        self._rewrites.discard(key)
        self._deletes.add(key)

    def _has_work(self) -> bool:
        return bool(self._deltas or self._rewrites or self._deletes)

    def _kick(self) -> None:
        self._idle.clear()
        self._wake.set()

    # ------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the background writer on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="prefix-pub")

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything so far is written; False if Redis did not take it in time."""
        if not self._has_work() and not self._in_flight:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def close(self, timeout_s: float = 1.0) -> None:
        """Write what is pending (briefly), stop the writer and close the client."""
        if self._task is not None:
            await self.flush(timeout_s)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.client.aclose()

    # ------------------------------------------------------------ the writer

    async def _run(self) -> None:
        backoff = self.min_backoff_s
        while True:
            if not self._has_work():
                self._idle.set()
                delay = self._last_refresh + self.refresh_s - time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(delay, 0.0))
            self._wake.clear()
            refresh = time.monotonic() >= self._last_refresh + self.refresh_s
            if not self._has_work() and not refresh:
                continue
            round_ = self._take_round(refresh)
            self._in_flight = True
            try:
                await self._write(round_)
            except Exception as exc:  # any Redis or socket error: never the caller's
                self._restore_after_failure(round_, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
                continue
            finally:
                self._in_flight = False
            backoff = self.min_backoff_s
            if refresh:
                self._last_refresh = time.monotonic()
            if not self.is_healthy:
                self.is_healthy = True
                log.info(
                    "redis reachable again; prefix index republished",
                    redis_keys=len(round_.rewrites),
                )

    def _take_round(self, refresh: bool) -> _Round:
        round_ = _Round(
            deletes=sorted(self._deletes),
            rewrites={key: list(self._desired[key]) for key in sorted(self._rewrites)},
            deltas=self._deltas,
            refresh=sorted(self._written) if refresh else [],
            exists_after={
                key: bool(self._desired.get(key)) for key in (*self._rewrites, *self._deltas)
            },
        )
        self._deletes, self._rewrites, self._deltas = set(), set(), {}
        return round_

    async def _write(self, round_: _Round) -> None:
        ttl = max(1, round(self.ttl_s))
        checks: list[tuple[int, str]] = []  # (result index, key) of EXPIREs on keys we wrote
        pipe = self.client.pipeline(transaction=True)
        for key in round_.deletes:
            pipe.delete(key)
        for key, hashes in round_.rewrites.items():
            pipe.delete(key)
            for start in range(0, len(hashes), _MAX_ARGS):
                pipe.sadd(key, *hashes[start : start + _MAX_ARGS])
            if hashes:
                pipe.expire(key, ttl)
        for key, delta in round_.deltas.items():
            if key in self._written:
                checks.append((len(pipe), key))
                pipe.expire(key, ttl)
            if delta.added:
                pipe.sadd(key, *delta.added)
            if delta.removed:
                pipe.srem(key, *delta.removed)
            pipe.expire(key, ttl)
        for key in round_.refresh:
            if key not in round_.deltas and key not in round_.rewrites:
                checks.append((len(pipe), key))
                pipe.expire(key, ttl)
        results = await pipe.execute() if len(pipe) else []

        for key in round_.deletes:
            self._written.discard(key)
        for key, exists in round_.exists_after.items():
            if exists:
                self._written.add(key)
            else:
                self._written.discard(key)
        lost = [key for index, key in checks if not results[index] and key in self._desired]
        if lost:
            log.warning("prefix keys vanished from redis; rewriting them", redis_keys=lost)
            self._rewrites.update(lost)
            for key in lost:
                self._deltas.pop(key, None)
            self._kick()

    def _restore_after_failure(self, round_: _Round, exc: Exception) -> None:
        self.num_failed_rounds += 1
        if self.is_healthy:
            log.warning("redis unavailable; prefix index will be republished", error=repr(exc))
        self.is_healthy = False
        # Unknown what reached Redis: rewrite every live key, redo every delete.
        self._deletes.update(key for key in round_.deletes if key not in self._desired)
        self._rewrites = set(self._desired)
        self._deltas = {}
        self._written.clear()
        self._kick()
