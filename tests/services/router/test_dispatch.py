"""Prefix-aware routing through Redis, retries on UNAVAILABLE, and life without Redis."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import grpc
import pytest

from quire.block.hashing import hash_full_blocks
from services.stack.ports import free_port
from tests.services.conftest import RedisServer, wait_for
from tests.services.router.conftest import MODEL_NAME, Cluster, RouterHandle
from tests.services.router.fake_executor import Script

PROMPT = list(range(100, 140))  # 2 full blocks + 8 tokens


def served_by(router: RouterHandle, prompt: Any, **kwargs: Any) -> str:
    with router.http() as http:
        response = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, **kwargs})
    assert response.status_code == 200, response.text
    return response.headers["x-quire-executor"]


def consistent_choice(ids: list[str], prompt: list[int]) -> str:
    """Where rendezvous hashing puts a prompt among idle executors, written from its
    definition rather than taken from the router's library: the key is the prompt's first
    full block's chained hash (its token ids as little-endian uint32s when it has none), each
    executor weighs the first 8 bytes of blake2b(key, 0, its id) as a little-endian integer,
    and the heaviest wins."""
    hashes = hash_full_blocks(prompt, 16, MODEL_NAME)
    key = hashes[0] if hashes else struct.pack(f"<{len(prompt)}I", *prompt)

    def weight(executor_id: str) -> int:
        digest = hashlib.blake2b(key + b"\x00" + executor_id.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    return max(ids, key=weight)


def test_shared_prefix_goes_to_the_holder(cluster: Cluster) -> None:
    router = cluster.router()
    fresh = consistent_choice(list(cluster.fakes), PROMPT)
    assert served_by(router, PROMPT) == fresh
    holder = next(e for e in cluster.fakes if e != fresh)
    cluster.seed_prefix(holder, PROMPT[:32])
    # A sibling sharing the two cached blocks, with a different tail.
    assert served_by(router, PROMPT[:32] + [7, 8, 9]) == holder
    with router.admin() as admin:
        metrics = admin.get("/metrics").text
    assert 'quire_router_routing_decisions_total{reason="prefix_hit"} 1.0' in metrics
    assert 'quire_router_routing_decisions_total{reason="consistent_hash"} 1.0' in metrics


def test_longest_leading_prefix_wins_and_gaps_do_not_count(cluster: Cluster) -> None:
    ids = sorted(cluster.fakes)
    cluster.seed_prefix(ids[0], PROMPT[:16])
    cluster.seed_prefix(ids[1], PROMPT[:32])
    # ids[2] holds only the second block's hash: not a leading hit.
    second = hash_full_blocks(PROMPT, 16, MODEL_NAME)[1]
    cluster.redis.sadd(f"{cluster.prefix}:prefix:{ids[2]}:7", second)
    router = cluster.router()
    assert served_by(router, PROMPT) == ids[1]


def test_stale_epoch_and_expired_records_are_ignored(cluster: Cluster) -> None:
    fresh = consistent_choice(list(cluster.fakes), PROMPT)
    other = next(e for e in cluster.fakes if e != fresh)
    cluster.seed_prefix(other, PROMPT, epoch=6)  # an older incarnation's cache
    router = cluster.router()
    assert served_by(router, PROMPT) == fresh
    # A member of the executor set whose record expired is dead: never chosen.
    cluster.redis.delete(f"{cluster.prefix}:executor:{fresh}")
    assert served_by(router, PROMPT) == consistent_choice(
        [e for e in cluster.fakes if e != fresh], PROMPT
    )
    with router.admin() as admin:
        status = admin.get("/cluster/status").json()
    expired = [e for e in status["executors"] if e["id"] == fresh]
    assert expired == [
        {
            "id": fresh,
            "address": "",
            "healthy": False,
            "num_running": 0,
            "num_waiting": 0,
            "kv_blocks_total": 0,
            "kv_blocks_used": 0,
            "kv_blocks_cached": 0,
            "block_size": None,
            "hash_extra_key": None,
        }
    ]


@pytest.mark.parametrize(("pulls", "reason"), [(False, "prefix_capped"), (True, "prefix_pull")])
def test_hot_prefix_is_capped_by_load(cluster: Cluster, pulls: bool, reason: str) -> None:
    """The holder is too loaded: the least loaded executor takes the prompt, and computes
    it (executors that do not pull) or pulls it from the holder."""
    ids = sorted(cluster.fakes)
    cluster.seed_prefix(ids[0], PROMPT)
    cluster.publish(ids[0], num_running=9, num_waiting=3)
    cluster.publish(ids[1], num_running=1)
    router = cluster.router(routing_pulls=pulls)
    assert served_by(router, PROMPT) == ids[2]
    with router.admin() as admin:
        assert f'reason="{reason}"}} 1.0' in admin.get("/metrics").text


def test_with_pulls_an_idle_executor_beats_a_busy_holder(cluster: Cluster) -> None:
    """Not overloaded enough to be capped, the holder still loses to an idle executor once
    its queue costs more than pulling the prefix saves: 2 blocks of 16 tokens are worth 32
    tokens held, 24 pulled (1 - 0.25); one queued request costs 16."""
    ids = sorted(cluster.fakes)
    cluster.seed_prefix(ids[0], PROMPT)
    cluster.publish(ids[0], num_running=1)
    cluster.publish(ids[1], num_running=1)
    without = cluster.router(routing_pulls=False)
    assert served_by(without, PROMPT) == ids[0]
    with_pulls = cluster.router(routing_pulls=True)
    assert served_by(with_pulls, PROMPT) == ids[2]


def test_short_prompts_hash_consistently(cluster: Cluster) -> None:
    router = cluster.router()
    short = [5, 6, 7]
    first = served_by(router, short)
    assert first == consistent_choice(list(cluster.fakes), short)
    assert all(served_by(router, short) == first for _ in range(3))


def test_unavailable_executor_is_retried_elsewhere(cluster: Cluster) -> None:
    dead = f"127.0.0.1:{free_port()}"
    cluster.publish("ex-dead", address=dead)
    cluster.seed_prefix("ex-dead", PROMPT)  # so the router tries it first
    router = cluster.router()
    winner = served_by(router, PROMPT)
    assert winner in cluster.fakes
    # Marked down locally: the next request does not try it again.
    assert served_by(router, PROMPT) == winner
    with router.admin() as admin:
        metrics = admin.get("/metrics").text
        status = admin.get("/cluster/status").json()
    assert "quire_router_executor_retries_total 1.0" in metrics
    dead_status = next(e for e in status["executors"] if e["id"] == "ex-dead")
    assert dead_status["healthy"] is False and dead_status["address"] == dead


def test_all_unavailable_is_503(cluster: Cluster) -> None:
    router = cluster.router(redis_url="", executors=f"127.0.0.1:{free_port()}")
    with router.http() as http:
        response = http.post("/v1/completions", json={"prompt": "x"})
    assert response.status_code == 503
    assert response.json()["error"]["code"] in ("no_executor", "executor_unavailable")


def test_redis_outage_keeps_serving(cluster: Cluster, redis_server: RedisServer) -> None:
    # A Redis of its own, so stopping it does not disturb the other tests.
    own = Cluster(cluster.bg, redis_server, cluster.fakes, prefix=cluster.prefix)
    own.publish_all()
    router = cluster.router(redis_url=redis_server.url, redis_timeout_s=0.2)
    served = {served_by(router, [i, i + 1, i + 2]) for i in range(10, 14)}
    redis_server.stop()
    failures = 0
    for i in range(20, 30):
        with router.http() as http:
            response = http.post("/v1/completions", json={"prompt": [i, 5, 6], "max_tokens": 2})
        failures += response.status_code != 200
        served.add(response.headers.get("x-quire-executor", ""))
    assert failures == 0
    assert served <= set(cluster.fakes)
    with router.http() as http, router.admin() as admin:
        health = http.get("/health")
        status = admin.get("/cluster/status").json()
    assert health.status_code == 200 and health.json()["source"] == "last_seen"
    assert status["source"] == "last_seen" and len(status["executors"]) == 3
    # Redis comes back empty (no persistence): the executors seen last carry on until
    # their heartbeats re-register them.
    redis_server.start()
    with router.http() as http:
        for i in range(3):
            response = http.post("/v1/completions", json={"prompt": [i, 9], "max_tokens": 1})
            assert response.status_code == 200
        own.publish_all()
        wait_for(lambda: http.get("/health").json()["source"] == "redis", 5)


def test_static_executors_without_redis(cluster: Cluster) -> None:
    addresses = [cluster.fakes[e].address for e in sorted(cluster.fakes)]
    router = cluster.router(redis_url="", executors=",".join(addresses))
    seen = {served_by(router, [i, 3, 4]) for i in range(10, 22)}
    assert seen <= set(addresses) and len(seen) >= 2  # spread by consistent hashing
    with router.http() as http:
        assert http.get("/health").json()["source"] == "static"


def test_cached_tokens_reported_in_usage_and_metrics(cluster: Cluster) -> None:
    cluster.script(Script(tokens=[50, 2], num_cached_tokens=32))
    router = cluster.router()
    client = router.openai()
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2)
    assert out.usage is not None and out.usage.prompt_tokens == 40
    assert out.usage.prompt_tokens_details is not None
    assert out.usage.prompt_tokens_details.cached_tokens == 32
    with router.admin() as admin:
        metrics = admin.get("/metrics").text
    assert "quire_router_prefix_hit_ratio 0.8" in metrics
    assert "quire_router_time_to_first_token_seconds_count 1.0" in metrics


def test_a_call_cancelled_by_a_stopping_executor_is_retried_elsewhere(cluster: Cluster) -> None:
    # An executor whose server stops (the end of its drain) cancels a call that reached it.
    ids = sorted(cluster.fakes)
    stopping = consistent_choice(ids, PROMPT)
    cluster.script(Script(error=grpc.StatusCode.CANCELLED), stopping)
    router = cluster.router()
    assert served_by(router, PROMPT) != stopping
    assert len(cluster.fakes[stopping].executor.requests) == 1
