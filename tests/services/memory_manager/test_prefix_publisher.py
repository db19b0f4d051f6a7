"""PrefixPublisher against a real redis-server: exact sets, TTLs, outages, lost keys."""

from __future__ import annotations

import asyncio
import time

import pytest

from quire.cluster.redis_keys import prefix_key
from services.memory_manager.prefix_publisher import PrefixPublisher
from tests.services.conftest import RedisServer

H = [bytes([i]) * 16 for i in range(8)]


def members(server: RedisServer, executor_id: str, epoch: int) -> set[bytes]:
    client = server.client()
    try:
        return set(client.smembers(prefix_key("t", executor_id, epoch)))  # type: ignore[arg-type]
    finally:
        client.close()


async def wait_until(predicate: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_reset_publish_drop_exact_sets(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        publisher = PrefixPublisher.from_url(redis_server.url, "t")
        publisher.start()
        publisher.reset("e1", 1, H[:2])
        publisher.reset("e2", 7, [])
        assert await publisher.flush()
        assert members(redis_server, "e1", 1) == set(H[:2])
        ttl = redis_server.client().ttl(prefix_key("t", "e1", 1))
        assert 0 < ttl <= 30  # type: ignore[operator]
        assert redis_server.client().exists(prefix_key("t", "e2", 7)) == 0  # empty: no key

        # Coalesced: added then removed before a round, and the reverse.
        publisher.publish("e1", 1, [H[2], H[3]], [H[0]])
        publisher.publish("e1", 1, [H[0]], [H[3]])
        publisher.publish("e2", 7, [H[5]], [])
        assert await publisher.flush()
        assert members(redis_server, "e1", 1) == {H[0], H[1], H[2]}
        assert members(redis_server, "e2", 7) == {H[5]}
        assert publisher.hashes("e1", 1) == {H[0], H[1], H[2]}

        # A new epoch replaces the old key; drop deletes.
        publisher.reset("e1", 2, [H[6]])
        publisher.drop("e2", 7)
        assert await publisher.flush()
        assert members(redis_server, "e1", 1) == set()
        assert members(redis_server, "e1", 2) == {H[6]}
        assert redis_server.client().keys("t:*") == [prefix_key("t", "e1", 2).encode()]
        with pytest.raises(ValueError, match="never reset"):
            publisher.publish("e9", 1, [H[0]], [])
        await publisher.close()

    asyncio.run(scenario())


def test_redis_outage_then_full_republish(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        publisher = PrefixPublisher.from_url(redis_server.url, "t", max_backoff_s=0.2)
        publisher.start()
        publisher.reset("e1", 1, H[:3])
        assert await publisher.flush()
        redis_server.stop()
        # Calls never fail while Redis is down; rounds fail in the background.
        publisher.publish("e1", 1, [H[4]], [H[0]])
        await wait_until(lambda: not publisher.is_healthy)
        publisher.publish("e1", 1, [H[5]], [])
        assert not await publisher.flush(timeout_s=0.3)
        redis_server.start()  # same port, empty
        assert await publisher.flush()
        assert publisher.is_healthy
        assert members(redis_server, "e1", 1) == {H[1], H[2], H[4], H[5]}
        await publisher.close()

    asyncio.run(scenario())


def test_vanished_keys_are_rewritten(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        publisher = PrefixPublisher.from_url(redis_server.url, "t", refresh_s=0.2)
        publisher.start()
        publisher.reset("e1", 1, H[:2])
        publisher.reset("e2", 1, H[2:4])
        assert await publisher.flush()
        redis_server.client().flushall()  # e.g. a Redis restart between two rounds
        # A delta on e1 notices its key is gone (EXPIRE answers 0) and rewrites it whole.
        publisher.publish("e1", 1, [H[6]], [])
        await wait_until(lambda: members(redis_server, "e1", 1) == {H[0], H[1], H[6]})
        # e2 had no changes: the periodic TTL refresh notices and rewrites it.
        await wait_until(lambda: members(redis_server, "e2", 1) == set(H[2:4]))
        assert publisher.is_healthy
        await publisher.close()

    asyncio.run(scenario())
