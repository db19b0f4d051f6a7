"""docs/metrics.md, written from the services' own metric registries.

Each service's metrics class is built with a fresh registry and walked with
`registry.collect()`: the names, types and help texts in the reference are the ones the
services serve. The naming scheme (docs/observability.md) is checked here too.

    python -m services.observability.metrics_reference           # rewrite docs/metrics.md
    python -m services.observability.metrics_reference --check   # exit 1 if it is stale
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from services.common.generated_files import generator_main
from services.executor.executor_metrics import ExecutorMetrics
from services.memory_manager.manager_metrics import ManagerMetrics
from services.router.router_metrics import RouterMetrics

REPO = Path(__file__).resolve().parents[2]
REFERENCE_FILE = REPO / "docs" / "metrics.md"
# Series names of a family in the scrape output, by type (counters are named with `_total`).
SERIES_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
}
NAME_PATTERN = re.compile(r"^quire_(router|executor|memory_manager)_[a-z][a-z0-9_]*[a-z0-9]$")
# Units Prometheus asks to be spelled in base units instead.
NON_BASE_UNITS = ("_ms", "_milliseconds", "_minutes", "_hours", "_percent", "_kb", "_mb", "_gb")


@dataclass(frozen=True)
class ServiceMetrics:
    """One service's metrics class, and where its series are served."""

    service: str  # the <service> of quire_<service>_*
    title: str
    served: str  # one line: which endpoint serves them
    build: Callable[[], Any]  # a fresh metrics object with its own `registry`


SERVICES = (
    ServiceMetrics(
        "router",
        "Router",
        "`GET /metrics` on the router's admin port.",
        RouterMetrics,
    ),
    ServiceMetrics(
        "executor",
        "Executor",
        "`/metrics` on the executor's `--metrics-port`. A series with a vLLM equivalent has "
        "vLLM's meaning under vLLM's name with `vllm:` replaced by `quire_executor_`; the "
        "swap series (`--preemption-mode swap`) have none.",
        lambda: ExecutorMetrics("model"),
    ),
    ServiceMetrics(
        "memory_manager",
        "Memory manager",
        "`/metrics` on the memory manager's `--metrics-port`.",
        ManagerMetrics,
    ),
)


@dataclass(frozen=True)
class MetricDoc:
    """One metric family as the reference lists it."""

    service: str
    name: str  # as scraped: counters with `_total`, histograms without `_bucket` etc.
    type: str  # counter, gauge or histogram
    labels: tuple[str, ...]
    help: str
    vllm: str | None  # the vLLM series it mirrors, if any

    @property
    def series(self) -> tuple[str, ...]:
        """The sample names a scrape of this family shows."""
        return tuple(self.name + s for s in SERIES_SUFFIXES[self.type])

    @property
    def unit(self) -> str:
        if self.name.endswith("_seconds"):
            return "seconds"
        if self.name.endswith(("_ratio", "_perc")):
            return "0..1"
        if self.name.endswith(("_bytes", "_bytes_total")):
            return "bytes"
        if self.help.startswith("1 while"):
            return "0 or 1"
        return "count"


def _label_names(metrics: object) -> dict[str, tuple[str, ...]]:
    # collect() shows labels only on samples, and a labelled metric has none until it is
    # used: the label names come from the metric objects the class holds.
    return {
        m._name: tuple(m._labelnames)
        for m in vars(metrics).values()
        if isinstance(m, MetricWrapperBase)
    }


def service_docs(entry: ServiceMetrics) -> list[MetricDoc]:
    """The metric families of one service, in registration order."""
    metrics = entry.build()
    registry: CollectorRegistry = metrics.registry
    labels = _label_names(metrics)
    vllm: dict[str, str] = getattr(metrics, "vllm_equivalents", {})
    docs = []
    for family in registry.collect():
        assert family.name in labels, f"{family.name}: not an attribute of {type(metrics)}"
        suffix = "_total" if family.type == "counter" else ""
        equivalent = vllm.get(family.name)
        docs.append(
            MetricDoc(
                service=entry.service,
                name=family.name + suffix,
                type=family.type,
                labels=labels[family.name],
                help=family.documentation,
                vllm=equivalent + suffix if equivalent else None,
            )
        )
    return docs


def metric_docs() -> list[MetricDoc]:
    """Every metric family of every service."""
    return [doc for entry in SERVICES for doc in service_docs(entry)]


def exposed_series() -> dict[str, MetricDoc]:
    """Every sample name the services serve -> its family."""
    return {series: doc for doc in metric_docs() for series in doc.series}


def scheme_violations(doc: MetricDoc) -> list[str]:
    """How one family breaks the naming scheme (docs/observability.md); [] when it does not."""
    problems = []
    match = NAME_PATTERN.match(doc.name)
    if match is None or match.group(1) != doc.service:
        problems.append(f"not quire_{doc.service}_<what>[_<unit>]")
    if (doc.type == "counter") != doc.name.endswith("_total"):
        problems.append("`_total` is for counters, and every counter ends with it")
    if doc.type == "histogram" and not doc.name.endswith("_seconds"):
        problems.append("histograms here measure time: `_seconds`")
    if doc.name.endswith(NON_BASE_UNITS):
        problems.append("not in base units (seconds, 0..1 ratios)")
    if doc.name.endswith("_perc") and not (doc.vllm or "").endswith("_perc"):
        problems.append("`_perc` only where vLLM's series is named so; else `_ratio`")
    if doc.vllm is not None and doc.name.removeprefix("quire_executor_") != doc.vllm.removeprefix(
        "vllm:"
    ):
        problems.append(f"an executor series is named quire_executor_<vLLM name> ({doc.vllm})")
    return problems


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """docs/metrics.md's exact text."""
    lines = [
        "# Metrics",
        "",
        "Generated from the services' metric registries by `make docs-metrics`",
        "(`python -m services.observability.metrics_reference`): do not edit by hand;",
        "a test fails while this file differs from what the code serves. The naming scheme,",
        "the alerts and how to load them: [observability.md](observability.md).",
        "",
        "Counters are listed as scraped, with `_total`. A histogram `name` is scraped as",
        "`name_bucket{le}`, `name_sum` and `name_count`. Times are in seconds, ratios 0..1.",
    ]
    for entry in SERVICES:
        lines += ["", f"## {entry.title}", "", entry.served, ""]
        lines += [
            "| name | type | labels | unit | meaning | vLLM equivalent |",
            "|---|---|---|---|---|---|",
        ]
        for doc in service_docs(entry):
            labels = ", ".join(f"`{label}`" for label in doc.labels) or "—"
            vllm = f"`{doc.vllm}`" if doc.vllm else "—"
            lines.append(
                f"| `{doc.name}` | {doc.type} | {labels} | {doc.unit} | {_cell(doc.help)} "
                f"| {vllm} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    prog = "services.observability.metrics_reference"
    return generator_main(prog, REFERENCE_FILE, render, "make docs-metrics", argv)


if __name__ == "__main__":
    raise SystemExit(main())
