"""The compose stack for real: the README's example, streaming, routing, status, Prometheus."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.compose.conftest import ADMIN_URL, compose, container_id, docker

MODEL = "smollm2-135m-instruct"
# The README's example, word for word.
README_CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 32,
    "temperature": 0,
}
GRAFANA_IMAGE = "grafana/grafana:12.1.1"
ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"


def test_readme_chat_example_answers_with_the_real_model(router_url: str) -> None:
    r = httpx.post(f"{router_url}/v1/chat/completions", json=README_CHAT, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert "Paris" in choice["message"]["content"], choice
    assert choice["finish_reason"] == "stop", choice  # ended at <|im_end|>, not the token cap


def test_streaming_gives_the_same_text_then_done(router_url: str) -> None:
    plain = httpx.post(f"{router_url}/v1/chat/completions", json=README_CHAT, timeout=120)
    expected = plain.json()["choices"][0]["message"]["content"]
    pieces: list[str] = []
    events: list[str] = []
    body = {**README_CHAT, "stream": True}
    with httpx.stream("POST", f"{router_url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
    assert events[-1] == "[DONE]"
    for data in events[:-1]:
        chunk = json.loads(data)
        for choice in chunk["choices"]:
            pieces.append(choice["delta"].get("content") or "")
    assert len([p for p in pieces if p]) > 1, "the answer came in one piece, not streamed"
    assert "".join(pieces) == expected


def test_a_prefix_sharing_group_stays_on_one_executor(router_url: str) -> None:
    rng = random.Random(7)
    prefix = [rng.randrange(5, 4000) for _ in range(160)]  # 10 blocks of 16 tokens
    served: list[str] = []
    cached: list[int] = []
    for i in range(6):
        body = {"model": MODEL, "prompt": [*prefix, 100 + i], "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{router_url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        served.append(r.headers["x-quire-executor"])
        details = r.json()["usage"].get("prompt_tokens_details") or {}
        cached.append(int(details.get("cached_tokens") or 0))
    assert len(set(served)) == 1, served
    assert min(cached[1:]) >= 144, cached  # the 9 full prefix blocks came from the cache


def test_cluster_status_lists_both_executors_at_their_service_names(router_url: str) -> None:
    status = httpx.get(f"{ADMIN_URL}/cluster/status", timeout=10).json()
    executors = {e["id"]: e for e in status["executors"]}
    assert set(executors) == {"executor-0", "executor-1"}, status
    assert all(e["healthy"] for e in executors.values()), status
    assert executors["executor-0"]["address"] == "executor-0:50061"
    assert executors["executor-1"]["address"] == "executor-1:50062"
    assert status["source"] == "redis"
    # Operations are on the admin port only, never the published API port.
    assert httpx.get(f"{router_url}/cluster/status", timeout=10).status_code == 404
    assert httpx.get(f"{ADMIN_URL}/metrics", timeout=10).status_code == 200


def prometheus_targets() -> list[dict[str, Any]]:
    prometheus = container_id("prometheus")
    assert prometheus, "the prometheus service has no container"
    url = "http://127.0.0.1:9090/api/v1/targets"
    done = docker("exec", prometheus, "wget", "-qO-", url)
    assert done.returncode == 0, done.stderr
    targets: list[dict[str, Any]] = json.loads(done.stdout)["data"]["activeTargets"]
    return targets


def test_prometheus_scrapes_every_quire_target_and_reports_them_up() -> None:
    expected = {
        ("quire-router", "router"),
        ("quire-memory-manager", "memory-manager"),
        ("quire-executor", "executor-0"),
        ("quire-executor", "executor-1"),
    }
    deadline = time.monotonic() + 60  # scrape interval 5 s; a fresh Prometheus needs a round
    health: dict[tuple[str, str], str] = {}
    while time.monotonic() < deadline:
        health = {
            (t["labels"]["job"], t["labels"]["instance"]): t["health"] for t in prometheus_targets()
        }
        if set(health) == expected and all(h == "up" for h in health.values()):
            break
        time.sleep(2)
    assert set(health) == expected, health
    assert all(h == "up" for h in health.values()), health


def test_prometheus_loads_every_alert_rule() -> None:
    prometheus = container_id("prometheus")
    assert prometheus, "the prometheus service has no container"
    done = docker("exec", prometheus, "wget", "-qO-", "http://127.0.0.1:9090/api/v1/rules")
    assert done.returncode == 0, done.stderr
    loaded = {
        (group["name"], rule["name"])
        for group in json.loads(done.stdout)["data"]["groups"]
        for rule in group["rules"]
    }
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    assert loaded == {(g["name"], r["alert"]) for g in groups for r in g["rules"]}


def has_grafana_image() -> bool:
    return docker("image", "inspect", GRAFANA_IMAGE).returncode == 0


def test_grafana_runs_and_reports_healthy() -> None:
    if not has_grafana_image():
        pytest.skip(
            f"needs the grafana image ({GRAFANA_IMAGE}): no registry is reachable here and no "
            "Debian or PyPI package carries it, so the stack runs without Grafana"
        )
    grafana = container_id("grafana")
    assert grafana, f"{GRAFANA_IMAGE} is here but the stack has no grafana container"
    state = docker("inspect", "-f", "{{.State.Health.Status}}", grafana).stdout.strip()
    assert state in ("healthy", "starting"), state


def test_a_stack_without_the_grafana_image_leaves_only_grafana_out() -> None:
    grafana = container_id("grafana")
    assert "grafana" in compose("config", "--services").split()  # still in compose.yaml
    if has_grafana_image():
        assert grafana, f"{GRAFANA_IMAGE} is here but the stack has no grafana container"
    else:
        assert not grafana, "a grafana container was created without its image"


@pytest.mark.parametrize("service", ["memory-manager", "executor-0", "executor-1", "router"])
def test_quire_containers_run_non_root_and_report_healthy(service: str) -> None:
    cid = container_id(service)
    assert cid, service
    fmt = "{{.Config.User}} {{.State.Health.Status}}"
    user, health = docker("inspect", "-f", fmt, cid).stdout.split()
    assert user == "10001:10001" and health == "healthy", (service, user, health)
    if service.startswith("executor-"):
        # The image's C++ kernels (built for x86-64-v3) load on this CPU: no torch fallback.
        probe = "from quire.kernels import cpp_attention; print(cpp_attention.unavailable_reason())"
        done = docker("exec", cid, "python", "-c", probe)
        assert done.returncode == 0 and done.stdout.strip() == "None", (done.stdout, done.stderr)
