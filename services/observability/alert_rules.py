"""The alert rules of deploy/prometheus/alerts.yml as a Kubernetes PrometheusRule.

deploy/prometheus/alerts.yml is the one copy of the rules. The Prometheus Operator reads
rules only from PrometheusRule objects, and kustomize reads no file outside
k8s/monitoring/, so k8s/monitoring/prometheus-rules.yaml is written from it here, groups
unchanged; a test fails while the two differ.

    python -m services.observability.alert_rules           # rewrite the PrometheusRule
    python -m services.observability.alert_rules --check   # exit 1 if it is stale
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from services.common.generated_files import generator_main

REPO = Path(__file__).resolve().parents[2]
ALERTS_FILE = REPO / "deploy" / "prometheus" / "alerts.yml"
RULE_FILE = REPO / "k8s" / "monitoring" / "prometheus-rules.yaml"
RULE_NAME = "quire-alerts"

HEADER = (
    "# Generated from deploy/prometheus/alerts.yml by\n"
    "# `python -m services.observability.alert_rules`: do not edit by hand.\n"
    "# kube-prometheus-stack only loads PrometheusRules carrying its release label unless\n"
    "# installed with prometheus.prometheusSpec.ruleSelectorNilUsesHelmValues=false.\n"
)


def load_alerts(path: Path = ALERTS_FILE) -> dict[str, Any]:
    """The Prometheus rule file as a mapping ({"groups": [...]})."""
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or set(doc) != {"groups"}:
        raise ValueError(f"{path}: a rule file holds `groups` and nothing else")
    return doc


def prometheus_rule(alerts: dict[str, Any]) -> dict[str, Any]:
    """The PrometheusRule object carrying the rule file's groups."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": RULE_NAME,
            "namespace": "quire",
            "labels": {"app.kubernetes.io/name": "quire", "app.kubernetes.io/part-of": "quire"},
        },
        "spec": {"groups": alerts["groups"]},
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL expressions) as literal blocks, as alerts.yml writes them."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _represent_str)


def render(alerts_file: Path = ALERTS_FILE) -> str:
    """k8s/monitoring/prometheus-rules.yaml's exact text."""
    rule = prometheus_rule(load_alerts(alerts_file))
    return HEADER + yaml.dump(rule, Dumper=_Dumper, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    prog = "services.observability.alert_rules"
    return generator_main(prog, RULE_FILE, render, f"python -m {prog}", argv)


if __name__ == "__main__":
    raise SystemExit(main())
