"""`python -m services.memory_manager` as a real process: crash + restart, Redis outage."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from quire.block import (
    AdmitRequest,
    AppendRequest,
    BlockManager,
    CommitRequest,
    ForkRequest,
    hash_full_blocks,
)
from quire.cluster.redis_keys import prefix_key
from services.memory_manager.prefix_publisher import REDIS_TIMEOUT_S as PUBLISHER_REDIS_TIMEOUT_S
from services.stack.ports import free_port
from tests.services.conftest import RedisServer, ServiceProcess, wait_for
from tests.services.memory_manager.conftest import MirroredAllocator

BS = 4
A = tuple(range(100, 110))  # 2 full blocks + 2
B = tuple(range(200, 212))  # 3 full blocks
C = tuple(range(300, 312))
HASHES_A = hash_full_blocks(A, BS)
MODULE = "services.memory_manager"


def manager_args(port: int, redis_url: str) -> list[str]:
    return ["--port", str(port), "--redis-url", redis_url, "--redis-prefix", "qp"]


def members(server: RedisServer, epoch: int = 1) -> set[bytes]:
    client = server.client()
    try:
        return set(client.smembers(prefix_key("qp", "e1", epoch)))  # type: ignore[arg-type]
    finally:
        client.close()


def test_sigkill_restart_reregisters_with_live_sequences(
    start_service: Callable[..., ServiceProcess], redis_server: RedisServer
) -> None:
    port = free_port()
    first = start_service(MODULE, manager_args(port, redis_server.url), port)
    executor = MirroredAllocator(first.target, num_blocks=16)
    executor.allocator.register()
    executor.step(admits=(AdmitRequest("a", A), AdmitRequest("b", B)))
    executor.step(
        forks=(ForkRequest("a", "c"),),
        commits=(CommitRequest("a", 10), CommitRequest("b", 8)),
    )
    executor.step(appends=(AppendRequest("a", (1,)), AppendRequest("c", (2,))))  # a copies
    tables = {s.seq_id: s.block_table for s in executor.block_tables.live_sequences()}
    used_before = executor.allocator.stats().num_blocks_used
    wait_for(lambda: members(redis_server) == {*HASHES_A, *hash_full_blocks(B, BS)[:2]})

    first.kill()
    start_service(MODULE, manager_args(port, redis_server.url), port)
    # b finishes in the step that meets the restart: the executor re-registers it with
    # the others (its tables still hold it), and the retried step frees it.
    result = executor.step(
        commits=(CommitRequest("a", 11), CommitRequest("b", 12)),
        frees=("b",),
        appends=(AppendRequest("a", (3,)), AppendRequest("c", (4,))),
    )
    assert executor.allocator.num_registrations == 2
    assert executor.tables("a", "c") == {"a": list(tables["a"]), "c": list(tables["c"])}
    assert result.copies == [] and result.preempted == []
    stats = executor.allocator.stats()
    assert stats.num_blocks_used == used_before - 3  # b's three blocks are free now
    # The new manager republished what it rebuilt: a's (and c's) computed full blocks, and
    # b's, all three once the retried step committed them, which its free left cached.
    wait_for(lambda: members(redis_server) == {*HASHES_A, *hash_full_blocks(B, BS)})
    # And serves the rebuilt state like the original: a prefix hit on a's blocks.
    result = executor.step(admits=(AdmitRequest("d", A[:8] + (0,)),))
    assert result.num_cached_tokens == {"d": 8}
    assert executor.tables("d")["d"][:2] == list(tables["a"][:2])
    executor.allocator.close()


def test_redis_outage_never_fails_steps_and_index_is_republished(
    start_service: Callable[..., ServiceProcess], redis_server: RedisServer
) -> None:
    port = free_port()
    service = start_service(MODULE, manager_args(port, redis_server.url), port)
    executor = MirroredAllocator(service.target, num_blocks=8)
    local = BlockManager(num_blocks=8, block_size=BS)  # the same steps, for the expected index

    def step(**fields: object) -> None:
        assert executor.step(**fields) == local.step(executor.last_step)

    def step_while_redis_hangs(**fields: object) -> None:
        # Paused, Redis accepts connections and never answers: a step that waited on it would
        # return only after the publisher's Redis timeout.
        start = time.monotonic()
        step(**fields)
        assert time.monotonic() - start < PUBLISHER_REDIS_TIMEOUT_S, "a Step waited on Redis"

    executor.allocator.register()
    step(admits=(AdmitRequest("a", A), AdmitRequest("b", B)))
    step(commits=(CommitRequest("a", 10), CommitRequest("b", 8)))
    wait_for(lambda: members(redis_server) == set(local.indexed_hashes()))

    assert redis_server.proc is not None
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        step_while_redis_hangs(commits=(CommitRequest("b", 12),), frees=("a",))
        # takes a's cached tail blocks: evictions
        step_while_redis_hangs(admits=(AdmitRequest("c", C[:6]),))
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    redis_server.stop()
    step(commits=(CommitRequest("c", 6),), appends=(AppendRequest("b", (1,)),))
    assert members_or_none(redis_server) is None

    redis_server.start()  # same port, empty
    expected = set(local.indexed_hashes())
    assert expected and expected != set(HASHES_A)
    wait_for(lambda: members(redis_server) == expected, what="republished index")
    executor.allocator.close()


def members_or_none(server: RedisServer) -> set[bytes] | None:
    try:
        return members(server)
    except Exception:
        return None
