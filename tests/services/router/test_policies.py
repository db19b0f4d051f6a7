"""The router's --routing-policy over fake executors, and executors that disagree on hashing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from quire.block.hashing import hash_full_blocks
from quire.cluster.policies import ConsistentHashPolicy
from tests.services.router.conftest import MODEL_NAME, Cluster, RouterHandle
from tests.services.router.fake_executor import Script

PROMPT = list(range(100, 140))  # 2 full blocks + 8 tokens


def served_by(router: RouterHandle, prompt: Any) -> str:
    with router.http() as http:
        response = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert response.status_code == 200, response.text
    return response.headers["x-quire-executor"]


def hash_params_and_metrics(router: RouterHandle) -> tuple[dict[str, Any], str]:
    """The hash parameters /cluster/status reports, and the /metrics text."""
    with router.admin() as admin:
        return admin.get("/cluster/status").json()["hash_params"], admin.get("/metrics").text


def test_round_robin_cycles_whatever_the_cache(cluster: Cluster) -> None:
    cluster.seed_prefix("ex-c", PROMPT)
    router = cluster.router(routing_policy="round-robin")
    assert [served_by(router, PROMPT) for _ in range(4)] == ["ex-a", "ex-b", "ex-c", "ex-a"]
    with router.admin() as admin:
        assert admin.get("/cluster/status").json()["routing_policy"] == "round-robin"
        metrics = admin.get("/metrics").text
    assert 'quire_router_routing_decisions_total{reason="round_robin"} 4.0' in metrics


def test_least_loaded_follows_the_records(cluster: Cluster) -> None:
    cluster.seed_prefix("ex-a", PROMPT)  # ignored by this policy
    cluster.publish("ex-a", num_running=5)
    cluster.publish("ex-b", num_running=1)
    cluster.publish("ex-c", num_running=3)
    router = cluster.router(routing_policy="least-loaded")
    assert served_by(router, PROMPT) == "ex-b"
    cluster.publish("ex-b", num_running=9)
    assert served_by(router, PROMPT) == "ex-c"


def test_hash_sends_a_first_block_to_its_ring_owner(cluster: Cluster) -> None:
    owner = ConsistentHashPolicy().owners(
        hash_full_blocks(PROMPT, 16, MODEL_NAME)[0], list(cluster.fakes)
    )[0]
    for other in cluster.fakes:
        if other != owner:
            cluster.seed_prefix(other, PROMPT)  # a cache the approximate router cannot see
    cluster.publish(owner, num_running=20)
    router = cluster.router(routing_policy="hash")
    assert {served_by(router, PROMPT[:16] + [i] * 20) for i in range(3)} == {owner}


def test_unknown_policy_is_refused_naming_the_flag() -> None:
    from services.router.router_settings import RouterSettings

    with pytest.raises(ValueError, match="routing_policy"):
        RouterSettings(routing_policy="random")  # type: ignore[arg-type]


def test_executors_that_disagree_on_block_size_are_loud(cluster: Cluster) -> None:
    # ex-a hashes with 32-token blocks, ex-b and ex-c with 16: the 16s are the majority.
    cluster.publish("ex-a", block_size=32)
    cluster.seed_prefix("ex-c", PROMPT)
    router = cluster.router()
    # Routing still works by the documented rule: the majority's hashes, prefix hits from
    # the executors that agree.
    assert served_by(router, PROMPT) == "ex-c"
    params, metrics = hash_params_and_metrics(router)
    assert params["mismatch"] is True
    assert params["block_size"] == 16
    assert params["disagreeing"] == ["ex-a"]
    assert [g["executors"] for g in params["groups"]] == [["ex-b", "ex-c"], ["ex-a"]]
    assert "quire_router_hash_params_mismatch 1.0" in metrics
    assert "quire_router_hash_params_disagreeing_executors 1.0" in metrics


def test_executor_extra_key_replaces_the_router_flag(cluster: Cluster) -> None:
    # Every executor announces another extra key than the router's --model dir name: the
    # router hashes with the executors' key, so their prefix sets match.
    for executor_id in cluster.fakes:
        cluster.publish(executor_id, hash_extra_key="served-elsewhere", block_size=8)
    hashes = hash_full_blocks(PROMPT, 8, "served-elsewhere")
    cluster.redis.sadd(f"{cluster.prefix}:prefix:ex-b:7", *hashes)
    router = cluster.router()
    assert served_by(router, PROMPT) == "ex-b"
    params, metrics = hash_params_and_metrics(router)
    assert params["mismatch"] is False
    assert (params["block_size"], params["extra_key"]) == (8, "served-elsewhere")
    assert "quire_router_hash_params_mismatch 0.0" in metrics


def test_cached_tokens_in_streamed_usage(cluster: Cluster) -> None:
    cluster.script(Script(tokens=[50, 51, 2], num_cached_tokens=32))
    router = cluster.router()
    body = {
        "prompt": PROMPT,
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with router.http() as http, http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        chunks = [
            json.loads(line[5:])
            for line in response.iter_lines()
            if line.startswith("data:") and line.strip() != "data: [DONE]"
        ]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert len(usage) == 1
    assert usage[0]["prompt_tokens"] == 40
    assert usage[0]["prompt_tokens_details"] == {"cached_tokens": 32}


def test_hash_watch_logs_a_mismatch_once_and_its_end() -> None:
    from structlog.testing import capture_logs

    from quire.cluster.hash_params import HashParams
    from quire.cluster.redis_keys import ExecutorRecord
    from services.router.directory import ClusterView
    from services.router.hash_watch import HashWatch
    from services.router.router_metrics import RouterMetrics

    def view(*sizes: int) -> ClusterView:
        records = [
            ExecutorRecord(f"ex-{i}", "-", 1, "m", block_size=s, hash_extra_key="m")
            for i, s in enumerate(sizes)
        ]
        return ClusterView(records, "redis")

    metrics = RouterMetrics()
    watch = HashWatch(HashParams(16, "m"), metrics)
    with capture_logs() as logs:
        assert watch.agreement(view(16, 32, 16)).is_mismatch
        watch.agreement(view(16, 32, 16))  # the same disagreement: no second line
        assert not watch.agreement(view(16, 16, 16)).is_mismatch
    assert [(e["log_level"], e.get("disagreeing")) for e in logs] == [
        ("error", ["ex-1"]),
        ("warning", None),
    ]
    assert metrics.hash_params_mismatch._value.get() == 0


def test_policy_from_env_and_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.router.__main__ import parse_settings

    monkeypatch.setenv("QUIRE_ROUTING_POLICY", "least-loaded")
    assert parse_settings([]).routing_policy == "least-loaded"
    assert parse_settings(["--routing-policy", "hash"]).routing_policy == "hash"
    monkeypatch.delenv("QUIRE_ROUTING_POLICY")
    assert parse_settings([]).routing_policy == "prefix"
