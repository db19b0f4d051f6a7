"""Liveness + load in Redis: an `ExecutorRecord` refreshed every HEARTBEAT_S.

The record lives at `executor_key(prefix, id)` with a TTL of LIVENESS_TTL_S (millisecond
precision), so a killed executor disappears from routing within that time. Redis being
down only delays routing information: errors are logged (once per outage) and retried
on the next beat, and never reach the serving path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog
from redis.exceptions import RedisError

from quire.cluster.redis_keys import (
    HEARTBEAT_S,
    LIVENESS_TTL_S,
    ExecutorRecord,
    executor_key,
    executors_key,
)
from services.common import redis_client

log = structlog.get_logger("quire.executor.liveness")

_REDIS_TIMEOUT_S = 1.0  # one beat must not hang longer than the record's lifetime


class LivenessPublisher:
    """Publishes `record()` every `interval_s` until closed."""

    def __init__(
        self,
        redis_url: str,
        prefix: str,
        record: Callable[[], ExecutorRecord],
        interval_s: float = HEARTBEAT_S,
    ) -> None:
        self.redis = redis_client.connect(redis_url, _REDIS_TIMEOUT_S)
        self.prefix = prefix
        self.record = record
        self.interval_s = interval_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._healthy = True

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="liveness")

    def publish_soon(self) -> None:
        """Beat now instead of waiting for the next interval (e.g. draining changed)."""
        self._wake.set()

    async def publish(self) -> bool:
        """One heartbeat; False (logged) if Redis failed."""
        record = self.record().stamped()
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(
                    executor_key(self.prefix, record.executor_id),
                    record.encode(),
                    px=int(LIVENESS_TTL_S * 1000),
                )
                pipe.sadd(executors_key(self.prefix), record.executor_id)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            if self._healthy:
                log.warning("liveness heartbeat failed; retrying", error=str(exc))
            self._healthy = False
            return False
        if not self._healthy:
            log.info("liveness heartbeat recovered")
        self._healthy = True
        return True

    async def _run(self) -> None:
        while True:
            try:
                await self.publish()
            except Exception:  # never let a bad beat end the heartbeat
                log.exception("liveness heartbeat crashed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            self._wake.clear()

    def stop(self) -> None:
        """Stop beating now (no more writes); `close()` still releases the connection."""
        if self._task is not None:
            self._task.cancel()

    async def close(self, delete: bool = True) -> None:
        """Stop beating; with `delete`, remove the record and the set membership."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if delete:
            executor_id = self.record().executor_id
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.delete(executor_key(self.prefix, executor_id))
                    pipe.srem(executors_key(self.prefix), executor_id)
                    await pipe.execute()
            except (RedisError, OSError) as exc:
                log.warning("could not delete the liveness record", error=str(exc))
        await self.redis.aclose()
