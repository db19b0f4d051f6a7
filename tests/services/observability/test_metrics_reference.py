"""docs/metrics.md is what the services serve, and every name follows the naming scheme."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.observability import metrics_reference
from services.observability.metrics_reference import MetricDoc, metric_docs, scheme_violations

REPO = Path(__file__).resolve().parents[3]
# Where metric names are written outside the code: queries, autoscalers, docs.
CONSUMERS = [
    *(REPO / "deploy").rglob("*.y*ml"),
    *(REPO / "deploy").rglob("*.json"),
    *(REPO / "k8s").rglob("*.yaml"),
    *(REPO / "k8s").rglob("*.json"),
    *(REPO / "docs").glob("*.md"),
    *(REPO / "services").glob("*/README.md"),
    REPO / "README.md",
    REPO / "k8s" / "README.md",
]
_NEW_NAME = re.compile(r"\bquire_(?:router|executor|memory_manager)_[a-z0-9_]*[a-z0-9]")


def test_reference_is_up_to_date() -> None:
    assert metrics_reference.REFERENCE_FILE.read_text() == metrics_reference.render(), (
        "docs/metrics.md differs from the services' registries: run `make docs-metrics`"
    )
    assert metrics_reference.main(["--check"]) == 0


def test_every_metric_follows_the_naming_scheme() -> None:
    docs = metric_docs()
    assert {d.service for d in docs} == {"router", "executor", "memory_manager"}
    for doc in docs:
        assert scheme_violations(doc) == [], doc.name
    names = [d.name for d in docs]
    assert len(names) == len(set(names))


# Executor series vLLM has no equivalent of: what preemption by swapping moved, and what
# was pulled from peers.
OWN_EXECUTOR_SERIES = {
    f"quire_executor_swap_{what}_total"
    for what in ("out_blocks", "out_bytes", "in_blocks", "in_bytes", "in_misses")
} | {
    f"quire_executor_{what}_total"
    for what in (
        "pulls",
        "pulled_blocks",
        "pulled_bytes",
        "pull_seconds",
        "pull_fallbacks",
        "pulls_declined",
        "memory_manager_steps",
    )
}
# Own series with a label beside model_name.
EXTRA_LABELS = {"quire_executor_memory_manager_steps_total": ("call",)}


def test_executor_series_are_vllm_series_under_the_quire_executor_prefix() -> None:
    executor = [d for d in metric_docs() if d.service == "executor"]
    assert executor
    assert {d.name for d in executor} >= OWN_EXECUTOR_SERIES
    for doc in executor:
        if doc.name in OWN_EXECUTOR_SERIES:
            assert doc.vllm is None, doc.name
        else:
            assert doc.vllm == "vllm:" + doc.name.removeprefix("quire_executor_"), doc.name
        assert doc.labels == ("model_name", *EXTRA_LABELS.get(doc.name, ())), doc.name
    assert all(d.vllm is None for d in metric_docs() if d.service != "executor")


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        (MetricDoc("executor", "quire:num_requests_running", "gauge", (), "", None), "quire_"),
        (MetricDoc("router", "quire_executor_requests_total", "counter", (), "", None), "quire_"),
        (MetricDoc("router", "quire_router_blocks_total", "gauge", (), "", None), "_total"),
        (MetricDoc("router", "quire_router_requests", "counter", (), "", None), "_total"),
        (MetricDoc("router", "quire_router_latency_ms", "gauge", (), "", None), "base units"),
        (MetricDoc("router", "quire_router_latency", "histogram", (), "", None), "_seconds"),
        (MetricDoc("router", "quire_router_usage_perc", "gauge", (), "", None), "_perc"),
    ],
)
def test_scheme_violations_name_the_broken_rule(doc: MetricDoc, problem: str) -> None:
    assert any(problem in p for p in scheme_violations(doc)), scheme_violations(doc)


def test_configs_and_docs_name_only_served_metrics() -> None:
    """Dashboards, alerts, autoscalers and docs use the served names, never the old schemes."""
    served = {d.name for d in metric_docs()} | set(metrics_reference.exposed_series())
    vllm_names = "|".join(
        d.name.removeprefix("quire_executor_").removesuffix("_total")
        for d in metric_docs()
        if d.service == "executor"
    )
    old_scheme = re.compile(rf"\bquire_mm_|\bquire:(?:{vllm_names})\b")
    for path in CONSUMERS:
        text = path.read_text()
        where = path.relative_to(REPO)
        assert not old_scheme.search(text), f"{where}: {old_scheme.search(text)}"
        unknown = set(_NEW_NAME.findall(text)) - served
        assert not unknown, f"{where} names metrics no service serves: {sorted(unknown)}"
