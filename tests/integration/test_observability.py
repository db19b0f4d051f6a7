"""Metrics, request-id logs and the Grafana dashboard against the real stack.

Runs before test_stack.py (which kills an executor) and kills nothing itself. Other modules
may have sent traffic first, so counts are lower bounds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from services.executor.executor_metrics import ExecutorMetrics
from services.memory_manager.manager_metrics import ManagerMetrics
from services.router.router_metrics import RouterMetrics
from services.stack.runner import Stack
from services.stack.spec import StackConfig
from tests.integration.conftest import REPO, wait_idle
from tests.services.conftest import wait_for

MODEL = "quire-tiny"
REQUEST_ID = "test-rid-123"
# Never logged unless --log-prompts: the test looks for it in every log.
SECRET = "zebra quartz observability probe"
# Long enough for full 16-token blocks, so a repeat is a prefix-cache hit.
SHARED = "The quick brown fox jumps over the lazy dog while the cache keeps its pages warm. " * 2
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "quire.json"
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
}
_METRIC = re.compile(r"\bquire[a-zA-Z0-9_:]*")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# --- helpers --------------------------------------------------------------------------------


def scrape(url: str) -> tuple[Samples, set[str]]:
    """Samples by (name, labels), and every series name the families expose."""
    text = httpx.get(url, timeout=5).text
    samples: Samples = {}
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + s for s in _SUFFIXES.get(family.type, ("",))}
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples, names


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def registry_names(registry: CollectorRegistry) -> set[str]:
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in _SUFFIXES.get(family.type, ("",))
    }


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [
        v["query"]["query"] for v in board["templating"]["list"] if isinstance(v["query"], dict)
    ]
    return exprs


def json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


# --- the dashboard, without a stack ---------------------------------------------------------


def test_dashboard_is_grafana_json_over_exposed_metrics() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["schemaVersion"] >= 36 and board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in board["panels"] if p["type"] != "row"]
    assert len(graphs) >= 12
    for panel in graphs:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
    exposed = (
        registry_names(ExecutorMetrics("m").registry)
        | registry_names(RouterMetrics().registry)
        | registry_names(ManagerMetrics().registry)
    )
    for expr in dashboard_exprs():
        names = set(_METRIC.findall(expr))
        assert names, expr
        assert names <= exposed, f"{expr}: {names - exposed} not exposed"
    assert "histogram_quantile(0.99" in DASHBOARD.read_text()


def test_prometheus_scrapes_the_default_stack_ports() -> None:
    c = StackConfig()
    ports = {
        "router": c.router_admin_port,  # /metrics is on the admin port
        "memory-manager": c.memory_manager_metrics_port,
        **{f"executor-{i}": c.executor_base_metrics_port + i for i in range(c.num_executors)},
    }
    # Local processes on 127.0.0.1; compose services by name, on the same ports.
    for file, host in [("prometheus.yml", lambda _: "127.0.0.1"), ("prometheus.compose.yml", str)]:
        config = yaml.safe_load((REPO / "deploy" / "prometheus" / file).read_text())
        targets = {
            group["labels"]["instance"]: target
            for job in config["scrape_configs"]
            for group in job["static_configs"]
            for target in group["targets"]
        }
        assert targets == {name: f"{host(name)}:{port}" for name, port in ports.items()}, file


# --- the live stack -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def traffic(stack: Stack) -> dict[str, Any]:
    """A few requests: one tagged with REQUEST_ID, a repeated prompt (prefix hit), a stream."""
    url = stack.config.router_url
    with httpx.Client(base_url=url, timeout=60) as http:
        tagged = http.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": SECRET, "max_tokens": 6, "temperature": 0},
            headers={"x-request-id": REQUEST_ID},
        )
        for _ in range(2):
            http.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": SHARED, "max_tokens": 4, "temperature": 0},
            ).raise_for_status()
        with http.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 5,
                "stream": True,
            },
        ) as stream:
            assert stream.status_code == 200
            body = "".join(stream.iter_text())
            assert body.rstrip().endswith("data: [DONE]")
        untagged = http.get("/v1/models", headers={"x-request-id": "bad id, with spaces"})
    wait_idle(stack)
    return {"tagged": tagged, "untagged": untagged}


def executor_urls(stack: Stack) -> dict[str, str]:
    c = stack.config
    return {
        f"executor-{i}": f"http://{c.host}:{c.executor_base_metrics_port + i}/metrics"
        for i in range(c.num_executors)
    }


def test_request_id_header_in_and_out(traffic: dict[str, Any]) -> None:
    tagged, untagged = traffic["tagged"], traffic["untagged"]
    assert tagged.status_code == 200
    assert tagged.headers["x-request-id"] == REQUEST_ID
    # An unusable id is replaced by a fresh one rather than echoed.
    assert re.fullmatch(r"[0-9a-f]{32}", untagged.headers["x-request-id"])


def test_router_metrics(stack: Stack, traffic: dict[str, Any]) -> None:
    samples, _ = scrape(f"{stack.config.router_admin_url}/metrics")
    completions = {"route": "/v1/completions", "status": "200"}
    assert total(samples, "quire_router_requests_total", **completions) >= 3
    assert total(samples, "quire_router_requests_total", route="/v1/chat/completions") >= 1
    assert total(samples, "quire_router_routing_decisions_total") >= 4
    assert total(samples, "quire_router_prompt_tokens_total") > 0
    assert total(samples, "quire_router_cached_prompt_tokens_total") > 0
    assert 0 < total(samples, "quire_router_prefix_hit_ratio") < 1
    assert total(samples, "quire_router_generation_tokens_total") > 0
    assert total(samples, "quire_router_time_to_first_token_seconds_count") >= 4
    duration = "quire_router_request_duration_seconds_count"
    assert total(samples, duration, route="/v1/completions") >= 3
    assert total(samples, "quire_router_in_flight_requests") == 0


def test_executor_metrics(stack: Stack, traffic: dict[str, Any]) -> None:
    scrapes = {name: scrape(url)[0] for name, url in executor_urls(stack).items()}
    for name, samples in scrapes.items():
        for gauge in (
            "quire_executor_num_requests_running",
            "quire_executor_num_requests_waiting",
            "quire_executor_kv_cache_usage_perc",
        ):
            assert (gauge, frozenset({("model_name", MODEL)})) in samples, (name, gauge)
        assert total(samples, "quire_executor_num_requests_running") == 0

    def summed(metric: str) -> float:
        return sum(total(s, metric) for s in scrapes.values())

    assert summed("quire_executor_prompt_tokens_total") > 0
    assert summed("quire_executor_generation_tokens_total") >= 6 + 4 + 4
    assert summed("quire_executor_prefix_cache_queries_total") > 0
    assert summed("quire_executor_prefix_cache_hits_total") > 0
    for histogram in (
        "quire_executor_time_to_first_token_seconds_count",
        "quire_executor_e2e_request_latency_seconds_count",
        "quire_executor_request_queue_time_seconds_count",
    ):
        assert summed(histogram) >= 4, histogram
    assert summed("quire_executor_inter_token_latency_seconds_count") >= 4
    preemptions = ("quire_executor_num_preemptions_total", frozenset({("model_name", MODEL)}))
    assert all(preemptions in s for s in scrapes.values())


def test_memory_manager_metrics(stack: Stack, traffic: dict[str, Any]) -> None:
    c = stack.config
    url = f"http://{c.host}:{c.memory_manager_metrics_port}/metrics"
    samples: Samples = {}

    def idle_with_cached_blocks() -> bool:
        # Pool gauges refresh every second. Finished requests leave their full blocks
        # cached (free, still findable by hash), none used.
        samples.update(scrape(url)[0])
        used = total(samples, "quire_memory_manager_blocks_used")
        return used == 0 and total(samples, "quire_memory_manager_blocks_cached") > 0

    wait_for(idle_with_cached_blocks, what="idle pools with cached blocks", poll_s=0.2)
    assert total(samples, "quire_memory_manager_step_duration_seconds_count") > 0
    assert total(samples, "quire_memory_manager_steps_total") > 0
    assert total(samples, "quire_memory_manager_registered_executors") == c.num_executors
    for i in range(c.num_executors):
        executor = f"executor-{i}"
        assert total(samples, "quire_memory_manager_blocks", executor=executor) == c.num_kv_blocks
        assert (
            "quire_memory_manager_blocks_cached",
            frozenset({("executor", executor)}),
        ) in samples


def test_dashboard_queries_only_live_metrics(stack: Stack, traffic: dict[str, Any]) -> None:
    c = stack.config
    urls = [
        f"{c.router_admin_url}/metrics",
        f"http://{c.host}:{c.memory_manager_metrics_port}/metrics",
        *executor_urls(stack).values(),
    ]
    live: set[str] = set()
    for url in urls:
        live |= scrape(url)[1]
    for expr in dashboard_exprs():
        missing = set(_METRIC.findall(expr)) - live
        assert not missing, f"{expr}: {missing} not served by the stack"


def test_request_id_reaches_every_service_log(stack: Stack, traffic: dict[str, Any]) -> None:
    served_by = traffic["tagged"].headers["x-quire-executor"]
    router = json_lines(stack.log_path("router"))
    assert any(
        line.get("request_id") == REQUEST_ID and line.get("route") == "/v1/completions"
        for line in router
    )
    executor = json_lines(stack.log_path(served_by))
    events = {line["event"] for line in executor if line.get("request_id") == REQUEST_ID}
    assert {"request added", "request finished"} <= events
    # The memory manager logs the step that admitted the request and the one that freed it.
    steps: list[dict[str, Any]] = []

    def mm_saw_admit_and_free() -> bool:
        steps[:] = [
            line
            for line in json_lines(stack.log_path("memory-manager"))
            if REQUEST_ID in line.get("request_ids", ())
        ]
        return any(s["num_admitted"] for s in steps) and any(s["num_freed"] for s in steps)

    wait_for(mm_saw_admit_and_free, what="the memory manager's step lines", poll_s=0.2)
    assert all(s["executor_id"] == served_by for s in steps)


def test_logs_are_json_and_never_hold_prompts(stack: Stack, traffic: dict[str, Any]) -> None:
    names = ["router", "memory-manager"] + list(executor_urls(stack))
    for name in names:
        text = stack.log_path(name).read_text(errors="replace")
        assert SECRET not in text, f"{name} logged the prompt"
        assert "quick brown fox" not in text, f"{name} logged the prompt"
        lines = [line for line in text.splitlines() if line.strip()]
        assert lines
        for line in lines:
            assert line.startswith("{"), f"{name}: not a JSON line: {line[:200]}"
            record = json.loads(line)
            assert record["service"] == ("executor" if "executor" in name else name)
            assert "timestamp" in record and "level" in record
