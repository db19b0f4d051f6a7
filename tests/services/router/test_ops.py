"""/health, /v1/models, /cluster/status, /metrics and the settings/flags."""

from __future__ import annotations

import os

import pytest

from services.router.__main__ import parse_settings
from services.router.router_settings import RouterSettings
from tests.services.router.conftest import MODEL_NAME, Cluster


def test_health_and_models(cluster: Cluster) -> None:
    router = cluster.router()
    with router.http() as http:
        health = http.get("/health")
        models = http.get("/v1/models").json()
    assert health.status_code == 200 and health.json()["executors"] == 3
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL_NAME]
    assert models["data"][0]["object"] == "model"
    assert [m.id for m in router.openai().models.list()] == [MODEL_NAME]


def test_cluster_status_shape(cluster: Cluster) -> None:
    cluster.publish("ex-a", num_running=3, num_waiting=1, kv_blocks_used=40, kv_blocks_cached=12)
    cluster.publish("ex-b", draining=True)
    router = cluster.router()
    with router.admin() as admin:
        status = admin.get("/cluster/status").json()
    by_id = {e["id"]: e for e in status["executors"]}
    assert set(by_id) == {"ex-a", "ex-b", "ex-c"}
    assert by_id["ex-a"] == {
        "id": "ex-a",
        "address": cluster.fakes["ex-a"].address,
        "healthy": True,
        "num_running": 3,
        "num_waiting": 1,
        "kv_blocks_total": 100,
        "kv_blocks_used": 40,
        "kv_blocks_cached": 12,
        "block_size": 16,
        "hash_extra_key": MODEL_NAME,
    }
    assert by_id["ex-b"]["healthy"] is False
    assert status["source"] == "redis"
    assert status["routing_policy"] == "prefix"
    assert status["hash_params"] == {
        "block_size": 16,
        "extra_key": MODEL_NAME,
        "source": "executors",
        "mismatch": False,
        "disagreeing": [],
        "groups": [
            {"block_size": 16, "extra_key": MODEL_NAME, "executors": ["ex-a", "ex-b", "ex-c"]}
        ],
    }


def test_records_of_other_models_are_ignored(cluster: Cluster) -> None:
    for executor_id in cluster.fakes:
        cluster.publish(executor_id, model="some-other-model")
    router = cluster.router()
    with router.http() as http:
        assert http.get("/health").status_code == 503


def test_metrics_families(cluster: Cluster) -> None:
    router = cluster.router()
    router.openai().completions.create(model=MODEL_NAME, prompt="x", max_tokens=1)
    with router.http() as http, router.admin() as admin:
        http.post("/v1/completions", json={"prompt": "x", "top_p": 9})
        text = admin.get("/metrics").text
    for family in (
        "quire_router_requests_total",
        "quire_router_routing_decisions_total",
        "quire_router_prefix_hit_ratio",
        "quire_router_admission_rejections_total",
        "quire_router_time_to_first_token_seconds_bucket",
    ):
        assert family in text
    assert 'quire_router_requests_total{route="/v1/completions",status="200"} 1.0' in text
    assert 'quire_router_requests_total{route="/v1/completions",status="400"} 1.0' in text


def test_healthy_executors_gauge_tells_what_health_answers(cluster: Cluster) -> None:
    """The gauge behind the QuireNoHealthyExecutor alert, refreshed when /metrics is scraped."""
    cluster.publish("ex-b", draining=True)
    router = cluster.router()
    with router.http() as http, router.admin() as admin:
        assert http.get("/health").json()["executors"] == 2
        assert "quire_router_healthy_executors 2.0" in admin.get("/metrics").text
    for executor_id in cluster.fakes:
        cluster.publish(executor_id, model="some-other-model")
    router = cluster.router()
    with router.http() as http, router.admin() as admin:
        assert "quire_router_healthy_executors 0.0" in admin.get("/metrics").text
        assert http.get("/health").status_code == 503


def test_request_id_is_echoed(cluster: Cluster) -> None:
    router = cluster.router()
    with router.http() as http:
        response = http.get("/v1/models", headers={"x-request-id": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"


def test_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIRE_PORT", "9001")
    monkeypatch.setenv("QUIRE_MAX_PENDING_TOTAL", "7")
    monkeypatch.setenv("QUIRE_EXECUTORS", "a:1, b:2")
    settings = parse_settings(["--port", "9100", "--served-model-name", "chat"])
    assert settings.port == 9100
    assert settings.max_pending_total == 7
    assert settings.executors == ["a:1", "b:2"]
    assert settings.model_name == "chat"
    assert settings.extra_key == "smollm2-135m-instruct"
    assert parse_settings(["--executors", "h:5"]).executors == ["h:5"]
    with pytest.raises(ValueError, match="host:port"):
        RouterSettings(executors="nope")  # type: ignore[arg-type]


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("QUIRE_")]:
        monkeypatch.delenv(name)
    settings = RouterSettings()
    assert (settings.host, settings.port, settings.model) == (
        "127.0.0.1",
        8000,
        "models/smollm2-135m-instruct",
    )
    assert settings.block_size == 16 and settings.redis_prefix == "quire"
    assert settings.model_name == "smollm2-135m-instruct"
    for name, field in RouterSettings.model_fields.items():
        assert field.description, f"{name} has no description"
