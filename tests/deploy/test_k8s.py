"""k8s/: every object valid for Kubernetes, and wired to flags and ports the services have.

kubectl and kustomize are not available offline: `tests.deploy.kustomize` renders the
kustomizations, built-in kinds are checked with kubernetes-validate's strict schemas, and the
custom resources (ServiceMonitor, ScaledObject) with the schemas in `crd_schemas`.
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from services.executor.executor_settings import ExecutorSettings
from services.stack.spec import CONTAINER_CONFIG
from tests.deploy import kustomize, service_flags
from tests.deploy.crd_schemas import CRD_SCHEMAS

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
# The oldest Kubernetes the manifests target (1.29: native sidecars on by default; k8s/README.md
# states it), the first where native sidecars are GA, and the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.29", "1.33", kubernetes_validate.utils.latest_version())
KUSTOMIZATIONS = ["overlays/cpu", "overlays/cuda", "monitoring", "keda"]
IMAGE_MODULES = {
    "quire-router": "services.router",
    "quire-executor": "services.executor",
    "quire-memory-manager": "services.memory_manager",
}
# Values the kubelet fills in from the downward API and the Secret, for expanding $(VAR).
DOWNWARD = {"metadata.name": "quire-executor-3", "status.podIP": "10.1.2.3"}
SECRET_VALUE = "0123456789abcdef"

Doc = dict[str, Any]


def render(name: str) -> list[Doc]:
    return kustomize.build(K8S / name)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    return {name: render(name) for name in KUSTOMIZATIONS}


@pytest.fixture(scope="module")
def cpu(rendered: dict[str, list[Doc]]) -> list[Doc]:
    return rendered["overlays/cpu"]


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} objects"
    return matches[0]


def workloads(docs: list[Doc]) -> Iterator[tuple[Doc, Doc]]:
    """(workload, container) for every container, init containers included."""
    for doc in docs:
        for container in kustomize.pod_containers(doc):
            yield doc, container


def quire_containers(docs: list[Doc]) -> Iterator[tuple[str, Doc, dict[str, str]]]:
    """(service module, container, resolved environment) for every Quire container."""
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    for _, container in workloads(docs):
        image = container["image"].rsplit(":", 1)[0]
        if image in IMAGE_MODULES:
            yield IMAGE_MODULES[image], container, container_env(container, configmaps)


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion; an unknown variable fails the test."""

    def sub(match: re.Match[str]) -> str:
        assert match.group(1) in env, f"$({match.group(1)}) is not defined before its use"
        return env[match.group(1)]

    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, value)


def container_env(container: Doc, configmaps: dict[str, dict[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif "fieldRef" in var["valueFrom"]:
            env[var["name"]] = DOWNWARD[var["valueFrom"]["fieldRef"]["fieldPath"]]
        elif "resourceFieldRef" in var["valueFrom"]:
            ref = var["valueFrom"]["resourceFieldRef"]
            assert ref["containerName"] == container["name"], "a resource of another container"
            kind, resource = ref["resource"].split(".")
            # divisor 1 rounds the quantity up to whole units, as the kubelet does
            quantity = container["resources"][kind][resource]
            cores = int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
            env[var["name"]] = str(math.ceil(cores))
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == ("quire-redis", "password")
            env[var["name"]] = SECRET_VALUE
    return env


def container_ports(container: Doc) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def validate(doc: Doc) -> None:
    crd_schema = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if crd_schema is not None:
        jsonschema.Draft202012Validator(crd_schema).validate(doc)
        return
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            name = f"{doc['kind']}/{doc['metadata']['name']}"
            raise AssertionError(f"{name} (k8s {version}): {path}: {exc.message}") from None


def test_every_rendered_object_and_extra_is_valid(rendered: dict[str, list[Doc]]) -> None:
    extras = [d for p in sorted((K8S / "extras").glob("*.yaml")) for d in kustomize.load_docs(p)]
    checked: list[Doc] = []
    for docs in [*rendered.values(), extras]:
        assert docs
        keys = [kustomize.object_key(d) for d in docs]
        assert len(keys) == len(set(keys)), "duplicate objects"
        for doc in docs:
            if doc["kind"] != "Namespace":
                assert doc["metadata"]["namespace"] == "quire"
            if doc not in checked:  # the overlays share most objects: validate each once
                validate(doc)
                checked.append(doc)


def test_every_manifest_file_is_rendered_or_an_extra() -> None:
    used: set[Path] = set()
    for kustomization in K8S.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kustomization.read_text())
        used.add(kustomization)
        for entry in [*spec.get("resources", []), *(p["path"] for p in spec.get("patches", []))]:
            used.add((kustomization.parent / entry).resolve())
    for path in K8S.rglob("*.yaml"):
        assert path.resolve() in used or path.parent.name == "extras", f"{path} is never applied"


def test_base_manifests_are_complete_objects(cpu: list[Doc]) -> None:
    """Each base file is whole (no kustomize-only fields): `kubectl apply -f` takes it too."""
    for path in sorted((K8S / "base").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            for doc in kustomize.load_docs(path):
                rendered = find(cpu, doc["kind"], doc["metadata"]["name"])
                assert doc == rendered or doc["kind"] in ("Deployment", "StatefulSet")
                assert doc["metadata"].get("namespace") == (
                    "quire" if doc["kind"] != "Namespace" else None
                )


def test_container_args_and_env_are_settings_the_services_accept(cpu: list[Doc]) -> None:
    seen = set()
    for module, container, env in quire_containers(cpu):
        seen.add(module)
        args = [expand(a, env) for a in container["args"]]
        known = service_flags.setting_names(module)
        for key in env:
            if key.startswith("QUIRE_") and key not in known:
                # A shared ConfigMap key another service reads; this one ignores it.
                assert any(key in service_flags.setting_names(m) for m in IMAGE_MODULES.values())
        settings = service_flags.parse(module, args, env)
        assert settings.host == "0.0.0.0"
        assert settings.redis_url == f"redis://:{SECRET_VALUE}@quire-redis:6379/0"
        assert settings.redis_prefix == "quire"
        if module != "services.memory_manager":
            assert settings.model == CONTAINER_CONFIG.model
            assert settings.block_size == 16
    assert seen == set(IMAGE_MODULES.values())


def test_configmap_keys_are_read_by_some_service(cpu: list[Doc]) -> None:
    data = find(cpu, "ConfigMap", "quire-settings")["data"]
    every_setting = set().union(*(service_flags.setting_names(m) for m in IMAGE_MODULES.values()))
    assert set(data) <= every_setting
    for _, container in workloads(cpu):
        if container["image"].rsplit(":", 1)[0] in IMAGE_MODULES:
            assert container["envFrom"] == [{"configMapRef": {"name": "quire-settings"}}]


def test_ports_match_the_stack_and_the_probes(cpu: list[Doc]) -> None:
    c = CONTAINER_CONFIG
    # module -> {container port name: (settings field, the stack's port)}
    expected = {
        "services.router": {
            "http": ("port", c.router_port),
            "admin": ("admin_port", c.router_admin_port),
        },
        "services.memory_manager": {
            "mm-grpc": ("port", c.memory_manager_port),
            "mm-metrics": ("metrics_port", c.memory_manager_metrics_port),
        },
        "services.executor": {
            "grpc": ("port", c.executor_base_port),
            "metrics": ("metrics_port", c.executor_base_metrics_port),
        },
    }
    for module, container, env in quire_containers(cpu):
        settings = service_flags.parse(module, [expand(a, env) for a in container["args"]], env)
        ports = container_ports(container)
        assert ports == {name: port for name, (_, port) in expected[module].items()}
        for name, (field, _) in expected[module].items():
            assert getattr(settings, field) == ports[name], (module, name)
        if module == "services.router":
            assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
            assert container["livenessProbe"]["tcpSocket"] == {"port": "http"}
            assert container["startupProbe"]["tcpSocket"] == {"port": "http"}
            continue
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == settings.port, (module, probe)


def test_executors_have_stable_ids_and_a_memory_manager_sidecar(cpu: list[Doc]) -> None:
    sts = find(cpu, "StatefulSet", "quire-executor")
    pod = sts["spec"]["template"]["spec"]
    assert sts["spec"]["serviceName"] == "quire-executor"
    (sidecar,) = pod["initContainers"]
    (executor,) = pod["containers"]
    assert sidecar["name"] == "memory-manager" and sidecar["restartPolicy"] == "Always"
    configmaps = {d["metadata"]["name"]: d["data"] for d in cpu if d["kind"] == "ConfigMap"}
    env = container_env(executor, configmaps)
    settings = service_flags.parse(
        "services.executor", [expand(a, env) for a in executor["args"]], env
    )
    mm_env = container_env(sidecar, configmaps)
    mm = service_flags.parse(
        "services.memory_manager", [expand(a, mm_env) for a in sidecar["args"]], mm_env
    )
    assert settings.executor_id == DOWNWARD["metadata.name"] == mm.manager_id
    assert settings.resolved_advertise_address(settings.port) == f"10.1.2.3:{settings.port}"
    assert settings.memory_manager == f"127.0.0.1:{mm.port}"
    drain_s = ExecutorSettings.model_fields["drain_timeout_s"].default
    assert pod["terminationGracePeriodSeconds"] > drain_s + mm.shutdown_grace_s


def test_the_router_drains_within_its_termination_grace(cpu: list[Doc]) -> None:
    pod = find(cpu, "Deployment", "quire-router")["spec"]["template"]["spec"]
    (router,) = pod["containers"]
    configmaps = {d["metadata"]["name"]: d["data"] for d in cpu if d["kind"] == "ConfigMap"}
    env = container_env(router, configmaps)
    settings = service_flags.parse("services.router", router["args"], env)
    command = router["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop_s = float(command[1])
    # The preStop sleep counts against the grace too, before SIGTERM starts the drain.
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + settings.shutdown_grace_s


def test_cuda_overlay_differs_only_by_the_executor_gpu(rendered: dict[str, list[Doc]]) -> None:
    cpu, cuda = rendered["overlays/cpu"], rendered["overlays/cuda"]
    assert [kustomize.object_key(d) for d in cpu] == [kustomize.object_key(d) for d in cuda]
    for a, b in zip(cpu, cuda, strict=True):
        if a["kind"] not in ("StatefulSet", "HorizontalPodAutoscaler"):
            assert a == b
    # One GPU per executor: the floor is one executor, so one GPU runs the overlay.
    hpa = find(cuda, "HorizontalPodAutoscaler", "quire-executor")["spec"]
    assert hpa["minReplicas"] == 1
    assert find(cuda, "HorizontalPodAutoscaler", "quire-router") == find(
        cpu, "HorizontalPodAutoscaler", "quire-router"
    )
    images = {c["name"]: c["image"] for _, c in workloads(cuda)}
    assert images == {
        "redis": "redis:7.4-alpine",
        "router": "quire-router:cpu",
        "memory-manager": "quire-memory-manager:cpu",
        "executor": "quire-executor:cuda",
    }
    assert {c["image"] for _, c in workloads(cpu)} >= {"quire-executor:cpu"}
    pod = find(cuda, "StatefulSet", "quire-executor")["spec"]["template"]["spec"]
    (executor,) = pod["containers"]
    assert executor["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "QUIRE_DEVICE", "value": "cuda"} in executor["env"]
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert not any("nvidia.com/gpu" in str(c.get("resources")) for _, c in workloads(cpu))


def test_every_container_has_requests_limits_and_a_locked_down_context(cpu: list[Doc]) -> None:
    for workload, container in workloads(cpu):
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) <= set(resources["limits"])
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"]
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True


def test_redis_password_comes_from_a_secret_that_is_not_committed(
    rendered: dict[str, list[Doc]], cpu: list[Doc]
) -> None:
    for docs in rendered.values():
        assert not any(d["kind"] == "Secret" for d in docs)
    redis = find(cpu, "Deployment", "quire-redis")["spec"]["template"]["spec"]["containers"][0]
    assert redis["args"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    for _, container in workloads(cpu):
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "quire-redis",
            "key": "password",
        }


def test_services_pdbs_and_monitors_select_real_pods_and_ports(
    rendered: dict[str, list[Doc]],
) -> None:
    docs = rendered["overlays/cpu"] + rendered["monitoring"]
    pods = [
        (d["spec"]["template"]["metadata"]["labels"], kustomize.pod_containers(d))
        for d in docs
        if kustomize.pod_spec(d) is not None
    ]

    def selected(selector: dict[str, str]) -> list[list[Doc]]:
        return [cs for labels, cs in pods if selector.items() <= labels.items()]

    services_by_labels = []
    for svc in (d for d in docs if d["kind"] == "Service"):
        (containers,) = selected(svc["spec"]["selector"])
        named = {n for c in containers for n in container_ports(c)}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= named
        services_by_labels.append(svc)
    for doc in docs:
        if doc["kind"] == "PodDisruptionBudget":
            assert len(selected(doc["spec"]["selector"]["matchLabels"])) == 1
        if doc["kind"] == "HorizontalPodAutoscaler":
            ref = doc["spec"]["scaleTargetRef"]
            find(docs, ref["kind"], ref["name"])
        if doc["kind"] == "ServiceMonitor":
            labels = doc["spec"]["selector"]["matchLabels"]
            (svc,) = [
                s for s in services_by_labels if labels.items() <= s["metadata"]["labels"].items()
            ]
            assert {e["port"] for e in doc["spec"]["endpoints"]} <= {
                p["name"] for p in svc["spec"]["ports"]
            }
    monitored = {
        e["port"] for d in docs if d["kind"] == "ServiceMonitor" for e in d["spec"]["endpoints"]
    }
    assert monitored == {"admin", "metrics", "mm-metrics"}


def test_autoscaling(rendered: dict[str, list[Doc]]) -> None:
    cpu = rendered["overlays/cpu"]
    router = find(cpu, "HorizontalPodAutoscaler", "quire-router")["spec"]
    assert router["metrics"] == [
        {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 70},
            },
        }
    ]
    executor = find(cpu, "HorizontalPodAutoscaler", "quire-executor")["spec"]
    assert executor["scaleTargetRef"]["kind"] == "StatefulSet"
    (metric,) = executor["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "quire_executor_num_requests_waiting"
    assert metric["pods"]["target"]["type"] == "AverageValue"
    keda = rendered["keda"]
    hpas = [d["metadata"]["name"] for d in keda if d["kind"] == "HorizontalPodAutoscaler"]
    assert hpas == ["quire-router"]  # KEDA owns the executors' HPA
    scaled = find(keda, "ScaledObject", "quire-executor")["spec"]
    assert scaled["scaleTargetRef"]["name"] == "quire-executor"
    (trigger,) = scaled["triggers"]
    query = " ".join(trigger["metadata"]["query"].split())
    assert query.startswith("sum(quire_executor_num_requests_waiting") and "/ count(" in query
    assert trigger["metricType"] == "Value"  # the query is already a per-executor average
    assert trigger["metadata"]["threshold"] == metric["pods"]["target"]["averageValue"]
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (
        executor["minReplicas"],
        executor["maxReplicas"],
    )


def test_only_the_router_is_reachable_from_outside_the_namespace(
    rendered: dict[str, list[Doc]],
) -> None:
    policies = [d for d in rendered["overlays/cpu"] if d["kind"] == "NetworkPolicy"]
    deny = [p for p in policies if p["spec"]["podSelector"] == {} and "ingress" not in p["spec"]]
    assert deny and deny[0]["spec"]["policyTypes"] == ["Ingress"]
    router_port = CONTAINER_CONFIG.router_port
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            sources = rule.get("from")
            if sources == [{"podSelector": {}}]:
                continue  # any pod of this namespace
            labels = policy["spec"]["podSelector"]["matchLabels"]
            assert labels["app.kubernetes.io/component"] == "router", policy["metadata"]["name"]
            assert rule["ports"] == [{"protocol": "TCP", "port": router_port}]
    # Prometheus' namespace reaches the metrics ports only: executors, managers, router admin.
    scraped = {
        (p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"], port["port"])
        for p in rendered["monitoring"]
        if p["kind"] == "NetworkPolicy"
        for rule in p["spec"]["ingress"]
        for port in rule["ports"]
    }
    assert scraped == {
        ("executor", CONTAINER_CONFIG.executor_base_metrics_port),
        ("executor", CONTAINER_CONFIG.memory_manager_metrics_port),
        ("router", CONTAINER_CONFIG.router_admin_port),
    }


def test_grafana_dashboard_configmap_is_the_dashboard(rendered: dict[str, list[Doc]]) -> None:
    """The kube-prometheus-stack Grafana sidecar loads ConfigMaps labelled grafana_dashboard."""
    configmap = find(rendered["monitoring"], "ConfigMap", "quire-grafana-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = REPO / "deploy" / "grafana" / "dashboards" / "quire.json"
    assert configmap["data"] == {"quire.json": dashboard.read_text()}, (
        "k8s/monitoring/dashboards/quire.json differs from deploy/grafana/dashboards/quire.json:"
        " copy it over"
    )
    # 256 KiB: the limit of the last-applied annotation of a client-side `kubectl apply`.
    assert len(configmap["data"]["quire.json"].encode()) < 256 * 1024


def test_generated_files_stay_inside_the_kustomization(tmp_path: Path) -> None:
    """kustomize refuses files outside the kustomization's directory; so does the stand-in."""
    (tmp_path / "k").mkdir()
    (tmp_path / "outside.json").write_text("{}")
    (tmp_path / "k" / "kustomization.yaml").write_text(
        "configMapGenerator:\n  - name: x\n    files: [../outside.json]\n"
        "    options: {disableNameSuffixHash: true}\n"
    )
    with pytest.raises(ValueError, match="outside the kustomization"):
        kustomize.build(tmp_path / "k")


def test_overlays_run_the_images_make_images_builds(rendered: dict[str, list[Doc]]) -> None:
    """`make images VARIANT=v` tags what k8s/overlays/v runs (deploy/docker/images.sh list)."""
    for variant in ("cpu", "cuda"):
        listed = subprocess.run(
            ["bash", str(REPO / "deploy" / "docker" / "images.sh"), "list", variant],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        used = {
            c["image"]
            for _, c in workloads(rendered[f"overlays/{variant}"])
            if c["image"].rsplit(":", 1)[0] in IMAGE_MODULES
        }
        assert used == set(listed), variant
    unknown = subprocess.run(
        ["bash", str(REPO / "deploy" / "docker" / "images.sh"), "list", "gpu"],
        capture_output=True,
        text=True,
    )
    assert unknown.returncode != 0 and "cpu or cuda" in unknown.stderr


def test_outside_traffic_reaches_only_the_authenticated_api(cpu: list[Doc]) -> None:
    """The Ingress routes /v1 and /health only, to the public port; keys come from a Secret."""
    (ingress,) = kustomize.load_docs(K8S / "extras" / "router-ingress.yaml")
    (rule,) = ingress["spec"]["rules"]
    routes = {
        (p["path"], p["pathType"], p["backend"]["service"]["port"]["name"])
        for p in rule["http"]["paths"]
    }
    assert routes == {("/v1", "Prefix", "http"), ("/health", "Exact", "http")}
    (balancer,) = kustomize.load_docs(K8S / "extras" / "router-loadbalancer.yaml")
    assert [p["targetPort"] for p in balancer["spec"]["ports"]] == ["http"]
    service = find(cpu, "Service", "quire-router")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {
        "http": CONTAINER_CONFIG.router_port,
        "admin": CONTAINER_CONFIG.router_admin_port,
    }
    # The router reads its keys from a file the Secret quire-api-keys mounts (not optional).
    pod = find(cpu, "Deployment", "quire-router")["spec"]["template"]["spec"]
    (router,) = pod["containers"]
    configmaps = {d["metadata"]["name"]: d["data"] for d in cpu if d["kind"] == "ConfigMap"}
    env = container_env(router, configmaps)
    settings = service_flags.parse("services.router", [expand(a, env) for a in router["args"]], env)
    keys_file = Path(settings.api_keys_file)
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in router["volumeMounts"] if keys_file.parent == Path(m["mountPath"])]
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == "quire-api-keys" and not secret.get("optional", False)
    assert keys_file.name == "keys"
