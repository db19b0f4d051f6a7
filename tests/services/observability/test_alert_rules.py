"""deploy/prometheus/alerts.yml: valid, tested with promtool, over served metrics only, loaded
by every Prometheus config and shipped unchanged to Kubernetes as a PrometheusRule."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.observability import alert_rules
from services.observability.metrics_reference import MetricDoc, metric_docs
from tests.deploy import kustomize

REPO = Path(__file__).resolve().parents[3]
PROMETHEUS = REPO / "deploy" / "prometheus"
CONFIGS = [PROMETHEUS / "prometheus.yml", PROMETHEUS / "prometheus.compose.yml"]
UNIT_TESTS = PROMETHEUS / "alerts.test.yml"
DOCS = REPO / "docs" / "observability.md"
# Labels every scraped series carries (static configs; pods and namespaces under k8s).
TARGET_LABELS = {"job", "instance", "namespace", "pod"}
PROMQL_WORDS = {
    *("sum", "max", "min", "avg", "count", "rate", "irate", "increase", "deriv", "delta"),
    *("histogram_quantile", "absent", "and", "or", "unless", "by", "without", "on"),
}
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"[^\"]*\"")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

Rule = dict[str, Any]


def rules() -> list[Rule]:
    return [r for g in alert_rules.load_alerts()["groups"] for r in g["rules"]]


def series_families() -> dict[str, MetricDoc]:
    """Every served sample name -> its family; `up` comes from Prometheus itself."""
    return {s: d for d in metric_docs() for s in d.series}


def metric_names(expr: str) -> set[str]:
    """The series names an expression reads (label matchers, ranges, groupings stripped)."""
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    bare = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", bare)
    return {t for t in _IDENTIFIER.findall(bare) if t not in PROMQL_WORDS}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: `make promtool` installs it (Debian's prometheus)")
    return path


def test_every_alert_pages_or_tickets_with_a_summary_and_a_runbook() -> None:
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names)) and all(n.startswith("Quire") for n in names)
    for rule in rules():
        assert rule["labels"]["severity"] in {"page", "ticket"}, rule["alert"]
        assert re.fullmatch(r"[0-9]+[smh]", rule["for"]), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description", "runbook"}, rule["alert"]


def test_alerts_read_only_served_metrics_and_their_labels() -> None:
    """A renamed metric or label cannot leave an alert watching nothing."""
    served = series_families()
    for rule in rules():
        expr = rule["expr"]
        names = metric_names(expr)
        assert names, rule["alert"]
        assert names <= served.keys() | {"up"}, f"{rule['alert']}: {names - served.keys()}"
        for name, matchers in _SELECTOR.findall(expr):
            doc = served.get(name)
            allowed = TARGET_LABELS | (set(doc.labels) if doc else set())
            if name.endswith("_bucket"):
                allowed.add("le")
            used = set(_MATCHER.findall(matchers))
            assert used <= allowed, f"{rule['alert']}: {name} has no label {used - allowed}"


def test_up_alerts_name_jobs_every_prometheus_scrapes() -> None:
    jobs = {j for r in rules() for j in re.findall(r'job="([^"]+)"', r["expr"])}
    assert jobs == {"quire-router", "quire-memory-manager"}
    for config in CONFIGS:
        scraped = {c["job_name"] for c in yaml.safe_load(config.read_text())["scrape_configs"]}
        assert jobs <= scraped, config.name
    # The ServiceMonitors set the same job names (the operator would name them after Services).
    monitors = kustomize.load_docs(REPO / "k8s" / "monitoring" / "servicemonitors.yaml")
    relabelled = {
        r["replacement"]
        for m in monitors
        for e in m["spec"]["endpoints"]
        for r in e.get("relabelings", [])
        if r["targetLabel"] == "job"
    }
    assert relabelled == {"quire-router", "quire-executor", "quire-memory-manager"}


def test_every_prometheus_config_loads_the_rules() -> None:
    for config in CONFIGS:
        rule_files = yaml.safe_load(config.read_text())["rule_files"]
        assert rule_files == ["alerts.yml"], config.name  # relative to the config file
        assert (config.parent / rule_files[0]).resolve() == alert_rules.ALERTS_FILE


def test_kubernetes_gets_the_same_rules() -> None:
    assert alert_rules.RULE_FILE.read_text() == alert_rules.render(), (
        "k8s/monitoring/prometheus-rules.yaml differs from deploy/prometheus/alerts.yml: "
        "run `python -m services.observability.alert_rules`"
    )
    (rule,) = [
        d for d in kustomize.build(REPO / "k8s" / "monitoring") if d["kind"] == "PrometheusRule"
    ]
    assert rule["spec"]["groups"] == alert_rules.load_alerts()["groups"]
    assert rule["metadata"]["namespace"] == "quire"


def test_the_operators_table_lists_every_alert() -> None:
    """docs/observability.md: one row per alert, with its `for` and severity."""
    rows = re.findall(
        r"^\| `(Quire\w+)` \|.*\| (\w+) \| (page|ticket) \| [^|]+ \|$", DOCS.read_text(), re.M
    )
    assert rows == [(r["alert"], r["for"], r["labels"]["severity"]) for r in rules()]


def test_load_alerts_refuses_anything_but_groups(tmp_path: Path) -> None:
    bad = tmp_path / "alerts.yml"
    bad.write_text("groups: []\nscrape_configs: []\n")
    with pytest.raises(ValueError, match="groups"):
        alert_rules.load_alerts(bad)


def test_promtool_checks_the_rules_and_the_configs() -> None:
    binary = promtool()
    files = [str(alert_rules.ALERTS_FILE)]
    subprocess.run([binary, "check", "rules", *files], check=True, capture_output=True)
    for config in CONFIGS:
        done = subprocess.run([binary, "check", "config", str(config)], capture_output=True)
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def test_alerts_fire_when_they_should(tmp_path: Path) -> None:
    """deploy/prometheus/alerts.test.yml, on a copy of the rules without annotations (promtool
    compares annotations too; their templates are checked above)."""
    alerts = alert_rules.load_alerts()
    for rule in (r for g in alerts["groups"] for r in g["rules"]):
        rule.pop("annotations")
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(alerts))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    done = subprocess.run(
        [promtool(), "test", "rules", UNIT_TESTS.name], cwd=tmp_path, capture_output=True
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    tested = set(re.findall(r"alertname: (\w+)", UNIT_TESTS.read_text()))
    assert tested == {r["alert"] for r in rules()}, "every alert has a unit test"
