"""The router's view of the executors: live records from Redis, prefix hits, local mark-downs.

Two Redis round trips at most per request, and usually one: the live records (one Lua call
doing SMEMBERS + MGET, reused for `registry_cache_s`) and one pipelined SMISMEMBER of the
prompt's block hashes on every live executor's prefix set. Only the prefix set of a record's
own epoch is read, so entries of a dead incarnation never count.

When Redis cannot be reached the router keeps serving: it routes over the executors it saw
last (or the static `--executors` list) by consistent hashing, and retries Redis after a
short back-off instead of paying a timeout on every request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from quire.cluster.redis_keys import (
    LIVENESS_TTL_S,
    ExecutorRecord,
    executor_key,
    executors_key,
    prefix_key,
)
from services.common import redis_client

log = structlog.get_logger("router.cluster")

# SMEMBERS of the executor set and MGET of every member's record, in one round trip.
# Returns a flat [id1, record1, id2, record2, ...]; a missing record is nil.
_LIVE_RECORDS_LUA = """
local ids = redis.call('SMEMBERS', KEYS[1])
if #ids == 0 then return {} end
local keys = {}
for i, id in ipairs(ids) do keys[i] = ARGV[1] .. id end
local records = redis.call('MGET', unpack(keys))
local out = {}
for i, id in ipairs(ids) do
  out[2 * i - 1] = id
  out[2 * i] = records[i]
end
return out
"""

REDIS_BACKOFF_S = 1.0  # after a Redis failure, skip Redis this long
FORGET_MISSING_S = 60.0  # a set member without a record this long is removed from the set
# An executor set that is suddenly empty (Redis restarted without data) is trusted only after
# this long; until then the executors seen last are used. Two heartbeats re-register them.
EMPTY_GRACE_S = 2 * LIVENESS_TTL_S


@dataclass(frozen=True)
class ClusterView:
    """The executors one request may be routed to, and where that list came from."""

    records: list[ExecutorRecord]
    source: str  # "redis", "last_seen" (Redis down) or "static" (no Redis / never seen)
    expired: tuple[str, ...] = ()  # ids in the executor set whose record has expired

    @property
    def has_prefix_index(self) -> bool:
        return self.source == "redis"


class ExecutorDirectory:
    """Live executors and their prefix caches, as Redis tells them (with a local fallback)."""

    def __init__(
        self,
        redis_url: str,
        redis_prefix: str,
        model_names: set[str],
        static_addresses: Sequence[str] = (),
        cache_s: float = 0.25,
        down_s: float = 5.0,
        timeout_s: float = 0.25,
    ) -> None:
        self.prefix = redis_prefix
        self.model_names = model_names
        self.cache_s = cache_s
        self.down_s = down_s
        self.redis: aioredis.Redis | None = None
        if redis_url:
            self.redis = redis_client.connect(redis_url, timeout_s)
            self._live_records = self.redis.register_script(_LIVE_RECORDS_LUA)
        self.static = [
            ExecutorRecord(executor_id=a, address=a, epoch=0, model=next(iter(model_names)))
            for a in static_addresses
        ]
        self._view: ClusterView | None = None
        self._view_at = 0.0
        self._last_seen: list[ExecutorRecord] = []
        self._last_seen_at = float("-inf")
        self._refresh_lock = asyncio.Lock()
        self._redis_retry_at = 0.0
        self._down_until: dict[str, float] = {}
        self._missing_since: dict[str, float] = {}
        self._other_models: set[tuple[str, str]] = set()  # (executor id, model) logged

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()

    # --- liveness --------------------------------------------------------------------------

    async def view(self) -> ClusterView:
        """Known executors (cached up to `cache_s`); draining and down ones included."""
        if self._is_fresh():
            assert self._view is not None
            return self._view
        async with self._refresh_lock:  # one Redis call per refresh, however many requests
            if self._is_fresh():
                assert self._view is not None
                return self._view
            fetched = await self._fetch_records()
            now = time.monotonic()
            if fetched is not None and (fetched.records or fetched.expired):
                self._last_seen, self._last_seen_at = fetched.records, now
                view = fetched
            elif fetched is not None and now - self._last_seen_at > EMPTY_GRACE_S:
                view = fetched  # an empty registry, for real
            elif self._last_seen:
                # Redis is down, or came back empty (restarted) and the executors have not
                # beaten yet: keep routing to the executors seen last.
                view = ClusterView(self._last_seen, "last_seen")
            else:
                view = ClusterView(self.static, "static") if fetched is None else fetched
            self._view, self._view_at = view, now
            return view

    def _is_fresh(self) -> bool:
        return self._view is not None and time.monotonic() - self._view_at < self.cache_s

    def cached_usable_executors(self) -> set[str]:
        """Executors of the last view that can take work (not draining, not down), no I/O."""
        if self._view is None:
            return set()
        down = self.down_executors()
        return {
            r.executor_id
            for r in self._view.records
            if not r.draining and r.executor_id not in down
        }

    def down_executors(self) -> set[str]:
        """Executors marked down locally after UNAVAILABLE, still inside their pause."""
        now = time.monotonic()
        return {e for e, until in self._down_until.items() if until > now}

    def mark_down(self, executor_id: str) -> None:
        """Skip an executor that answered UNAVAILABLE for `down_s` seconds."""
        self._down_until[executor_id] = time.monotonic() + self.down_s
        log.warning("executor marked down", executor_id=executor_id, seconds=self.down_s)

    def _redis_usable(self) -> bool:
        return self.redis is not None and time.monotonic() >= self._redis_retry_at

    def _redis_failed(self, error: Exception) -> None:
        if time.monotonic() >= self._redis_retry_at:
            log.warning("redis unavailable, routing without it", error=repr(error))
        self._redis_retry_at = time.monotonic() + REDIS_BACKOFF_S

    async def _fetch_records(self) -> ClusterView | None:
        if not self._redis_usable():
            return None
        assert self.redis is not None
        try:
            flat = await self._live_records(
                keys=[executors_key(self.prefix)], args=[executor_key(self.prefix, "")]
            )
        except (RedisError, OSError) as error:
            self._redis_failed(error)
            return None
        now = time.monotonic()
        records: list[ExecutorRecord] = []
        missing: list[str] = []
        for raw_id, raw in zip(flat[0::2], flat[1::2], strict=True):
            executor_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            if raw is None:
                missing.append(executor_id)
                continue
            self._missing_since.pop(executor_id, None)
            try:
                record = ExecutorRecord.decode(raw)
            except (ValueError, TypeError, msgpack.UnpackException) as error:
                log.warning("bad executor record", executor_id=executor_id, error=repr(error))
                continue
            if record.model in self.model_names:
                records.append(record)
            elif (executor_id, record.model) not in self._other_models:
                # Router and executors were given different QUIRE_MODEL values: say so once.
                self._other_models.add((executor_id, record.model))
                log.warning(
                    "executor serves another model; not routing to it",
                    executor_id=executor_id,
                    executor_model=record.model,
                    router_models=sorted(self.model_names),
                )
        await self._forget_dead(missing, now)
        records.sort(key=lambda r: r.executor_id)
        return ClusterView(records, "redis", tuple(sorted(missing)))

    async def _forget_dead(self, missing: list[str], now: float) -> None:
        # Expired records are dead incarnations; drop their ids from the set lazily, long
        # after any heartbeat could have refreshed them.
        stale = []
        for executor_id in missing:
            since = self._missing_since.setdefault(executor_id, now)
            if now - since > FORGET_MISSING_S:
                stale.append(executor_id)
        if stale and self.redis is not None:
            try:
                await self.redis.srem(executors_key(self.prefix), *stale)
            except (RedisError, OSError) as error:
                self._redis_failed(error)
            for executor_id in stale:
                self._missing_since.pop(executor_id, None)

    # --- prefix hits -----------------------------------------------------------------------

    async def prefix_hits(self, view: ClusterView, block_hashes: Sequence[bytes]) -> dict[str, int]:
        """Leading prompt blocks cached on each executor ({} when unknown)."""
        if not block_hashes or not view.records or not view.has_prefix_index:
            return {}
        if not self._redis_usable():
            return {}
        assert self.redis is not None
        pipe = self.redis.pipeline(transaction=False)
        for record in view.records:
            pipe.smismember(
                prefix_key(self.prefix, record.executor_id, record.epoch), list(block_hashes)
            )
        try:
            results = await pipe.execute()
        except (RedisError, OSError) as error:
            self._redis_failed(error)
            return {}
        hits: dict[str, int] = {}
        for record, members in zip(view.records, results, strict=True):
            count = 0
            for member in members:
                if not member:
                    break
                count += 1
            if count:
                hits[record.executor_id] = count
        return hits
