"""The prefix index mirrored into Redis by an in-process manager: exact sets per executor."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from quire.block import (
    AdmitRequest,
    CommitRequest,
    StepAllocation,
    TableUpdate,
    hash_full_blocks,
)
from quire.block.tables import BlockTables
from quire.cluster.redis_keys import prefix_key
from services.executor.remote_allocator import RemoteBlockAllocator
from tests.services.conftest import RedisServer, wait_for
from tests.services.memory_manager.conftest import ManagerThread
from tests.services.memory_manager.prompts import BS, A, B, C

D = tuple(range(400, 408))
HA, HB = hash_full_blocks(A, BS), hash_full_blocks(B, BS)


@pytest.fixture
def manager_with_redis(redis_server: RedisServer) -> Iterator[ManagerThread]:
    thread = ManagerThread(redis_url=redis_server.url, redis_prefix="qt").start()
    yield thread
    thread.stop()


def allocator(target: str, epoch: int = 1) -> RemoteBlockAllocator:
    return RemoteBlockAllocator(target, "e1", epoch, 8, BS, True, "127.0.0.1:7000", BlockTables(BS))


def expect_members(
    manager: ManagerThread, server: RedisServer, epoch: int, expected: set[bytes]
) -> None:
    """Once the manager's publisher has written every step so far, the key holds exactly
    `expected` (no waiting for a state that may hold already before the step is written)."""
    publisher = manager.server.publisher
    assert publisher is not None
    assert manager.call(publisher.flush()), "the publisher did not write in time"
    client = server.client()
    key = prefix_key("qt", "e1", epoch)
    assert set(client.smembers(key)) == expected, f"{key}: not the {len(expected)} hashes"  # type: ignore[arg-type]
    if expected:
        assert 0 < client.ttl(key) <= 30  # type: ignore[operator]
    client.close()


def test_committed_blocks_published_and_evicted_ones_removed(
    manager_with_redis: ManagerThread, redis_server: RedisServer
) -> None:
    with allocator(manager_with_redis.target) as remote:
        remote.register()
        remote.step(StepAllocation(admits=(AdmitRequest("a", A), AdmitRequest("b", B))))
        remote.step(StepAllocation())
        expect_members(manager_with_redis, redis_server, 1, set())  # nothing computed yet
        remote.step(StepAllocation(commits=(CommitRequest("a", 10), CommitRequest("b", 8))))
        expect_members(manager_with_redis, redis_server, 1, {*HA, HB[0], HB[1]})
        remote.step(StepAllocation(commits=(CommitRequest("b", 12),), frees=("a",)))
        expect_members(
            manager_with_redis, redis_server, 1, {*HA, *HB}
        )  # a's blocks are cached, still indexed
        # c takes the two never-used blocks and a's partial tail block: nothing evicted;
        # d then reuses a's cached blocks 1 and 0: both hashes leave the index.
        result = remote.step(StepAllocation(admits=(AdmitRequest("c", C),)))
        assert result.table_updates == {"c": TableUpdate(0, (6, 7, 2))}
        expect_members(manager_with_redis, redis_server, 1, {*HA, *HB})
        result = remote.step(StepAllocation(admits=(AdmitRequest("d", D),)))
        assert result.table_updates == {"d": TableUpdate(0, (1, 0))}
        expect_members(manager_with_redis, redis_server, 1, set(HB))
        remote.deregister()
        client = redis_server.client()
        wait_for(lambda: client.exists(prefix_key("qt", "e1", 1)) == 0, what="key deleted")


def test_new_epoch_deletes_the_old_key(
    manager_with_redis: ManagerThread, redis_server: RedisServer
) -> None:
    with allocator(manager_with_redis.target, epoch=1) as old:
        old.register()
        old.step(StepAllocation(admits=(AdmitRequest("a", A),)))
        old.step(StepAllocation(commits=(CommitRequest("a", 10),)))
        expect_members(manager_with_redis, redis_server, 1, set(HA))
    with allocator(manager_with_redis.target, epoch=2) as new:
        new.register()  # a restarted executor: no live sequences
        expect_members(manager_with_redis, redis_server, 1, set())
        new.step(StepAllocation(admits=(AdmitRequest("b", B),)))
        new.step(StepAllocation(commits=(CommitRequest("b", 12),)))
        expect_members(manager_with_redis, redis_server, 2, set(HB))
        expect_members(manager_with_redis, redis_server, 1, set())
