"""compose.yaml: generated from the stack's process list, valid, and wired like `make up`."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from services.stack import compose
from services.stack.spec import (
    CONTAINER_CONFIG,
    HealthCheck,
    ProcessSpec,
    StackConfig,
    stack_processes,
)
from tests.deploy import service_flags

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "deploy" / "schemas" / "compose-spec.json").read_text())
LOCAL = StackConfig(python="/usr/bin/python3", model="models/quire-tiny")
# Services added by deploy/compose/*.yaml fragments, after the stack's processes.
FRAGMENT_SERVICES = ["prometheus", "grafana"]


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's `${NAME}`, `${NAME:-default}` and `${NAME:?error}` under `env`."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if op == ":?":
            raise ValueError(arg)
        return arg if op == ":-" else env.get(name, "")

    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value)


def service_env(service: dict[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """The environment a container of `service` gets when compose runs under `env`."""
    return {k: interpolate(v, env) for k, v in service.get("environment", {}).items()}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return yaml.safe_load((REPO / "compose.yaml").read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def specs() -> dict[str, ProcessSpec]:
    return {p.name: p for p in stack_processes(CONTAINER_CONFIG)}


def test_compose_yaml_is_up_to_date() -> None:
    assert (REPO / "compose.yaml").read_text() == compose.render(), (
        "compose.yaml is out of date with services/stack/spec.py: run `make compose`"
    )


def test_compose_yaml_matches_the_compose_schema(doc: dict[str, Any]) -> None:
    jsonschema.Draft7Validator(SCHEMA).validate(doc)


def test_gpu_override_matches_the_schema_and_merges(doc: dict[str, Any]) -> None:
    override = yaml.safe_load((REPO / "deploy" / "compose.gpu.yaml").read_text())
    jsonschema.Draft7Validator(SCHEMA).validate(override)
    assert set(override["services"]) <= set(doc["services"])
    for name, service in override["services"].items():
        assert name.startswith("executor-")
        assert service["build"]["args"]["VARIANT"] == "cuda"
        assert service["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"


def test_services_are_the_stack_processes(
    doc: dict[str, Any], specs: dict[str, ProcessSpec]
) -> None:
    stack = ["redis", "memory-manager", "executor-0", "executor-1", "router"]
    assert list(specs) == stack
    assert list(doc["services"]) == [*stack, *FRAGMENT_SERVICES]


def test_every_service_runs_the_stack_argv_and_env(
    doc: dict[str, Any], specs: dict[str, ProcessSpec]
) -> None:
    for name, spec in specs.items():
        service = doc["services"][name]
        argv = [*service.get("entrypoint", []), *service["command"]]
        assert argv == spec.argv, name
        assert service_env(service, {}) == spec.env, name
        if name != "redis":
            target = spec.argv[2].removeprefix("services.").replace("_", "-")
            assert service["build"]["target"] == target
            assert service["image"] == f"quire-{target}:cpu"


def test_container_argv_is_the_local_argv_with_addresses_mapped() -> None:
    """The only differences from `make up`: bind 0.0.0.0, reach peers by service name, and
    torch threads left to each container's environment (so no shared cores file either)."""
    c = CONTAINER_CONFIG
    local = {p.name: p.argv for p in stack_processes(LOCAL)}
    container = {p.name: p.argv for p in stack_processes(c)}
    mapping = {
        LOCAL.python: "python",
        "redis://127.0.0.1:6379/0": "redis://redis:6379/0",
        "127.0.0.1:50051": "memory-manager:50051",
    }
    assert c.host == "0.0.0.0" and c.address_by_name and c.model == "/models/smollm2-135m-instruct"
    for name, argv in local.items():
        expected = []
        for i, arg in enumerate(argv):
            if i > 0 and argv[i - 1] in ("--host", "--bind"):
                expected.append("0.0.0.0")
            else:
                expected.append(mapping.get(arg, arg))
        if name.startswith("executor-"):
            threads = argv.index("--torch-threads")
            assert int(argv[threads + 1]) >= 1
            share = argv.index("--share-cores-file")
            assert argv[share + 2 : share + 6 : 2] == ["--share-cores-slot", "--share-cores-total"]
            del expected[share : share + 6]  # after the threads: delete it first
            del expected[threads : threads + 2]
            port = argv[argv.index("--port") + 1]
            expected += ["--advertise-address", f"{name}:{port}"]
        assert container[name] == expected, name
    # Nothing in the container argv points at the loopback any more.
    assert not any("127.0.0.1" in arg for argv in container.values() for arg in argv)


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"QUIRE_MODEL": "/models/other", "QUIRE_NUM_KV_BLOCKS": "512", "QUIRE_DTYPE": "bfloat16"},
    ],
)
def test_the_model_variables_reach_the_router_and_every_executor(
    doc: dict[str, Any], specs: dict[str, ProcessSpec], env: dict[str, str]
) -> None:
    """`QUIRE_MODEL=... docker compose up`: the router and the executors serve what the caller
    names, as `make up` would (StackConfig.from_env); unset, the stack's defaults."""
    expected = StackConfig.from_env(env)
    for name, spec in specs.items():
        if name in ("redis", "memory-manager"):
            assert "QUIRE_MODEL" not in doc["services"][name].get("environment", {})
            continue
        container_env = service_env(doc["services"][name], env)
        settings = service_flags.parse(spec.argv[2], spec.argv[3:], container_env)
        assert settings.model == env.get("QUIRE_MODEL", CONTAINER_CONFIG.model), name
        if name.startswith("executor-"):
            assert settings.num_kv_blocks == expected.num_kv_blocks
            assert settings.dtype == expected.executor_dtype


def test_the_kv_pool_is_sized_by_the_executor_unless_chosen(doc: dict[str, Any]) -> None:
    """No block count is written into the files: unset, each executor sizes its pool from
    memory (90% of the free GPU memory under deploy/compose.gpu.yaml)."""
    gpu = yaml.safe_load((REPO / "deploy" / "compose.gpu.yaml").read_text())
    for name, service in doc["services"].items():
        if name.startswith("executor-"):
            assert "--num-kv-blocks" not in service["command"]
            executor_env = service_env(service, {})
            settings = service_flags.parse("services.executor", service["command"], executor_env)
            assert settings.num_kv_blocks is None
            assert "QUIRE_NUM_KV_BLOCKS" not in gpu["services"][name].get("environment", {})


def test_a_checkpoint_on_the_host_is_mounted_where_quire_model_names_it(
    doc: dict[str, Any], specs: dict[str, ProcessSpec]
) -> None:
    override = yaml.safe_load((REPO / "deploy" / "compose.model.yaml").read_text())
    jsonschema.Draft7Validator(SCHEMA).validate(override)
    readers = {name for name, spec in specs.items() if "QUIRE_MODEL" in spec.env}
    assert set(override["services"]) == readers == {"executor-0", "executor-1", "router"}
    env = {"QUIRE_MODEL": "/srv/checkpoints/llama"}
    for name, service in override["services"].items():
        (mount,) = service["volumes"]
        assert mount["type"] == "bind" and mount["read_only"] is True
        assert interpolate(mount["source"], env) == interpolate(mount["target"], env)
        assert (
            interpolate(mount["target"], env)
            == service_env(doc["services"][name], env)["QUIRE_MODEL"]
        )
        with pytest.raises(ValueError, match="set QUIRE_MODEL"):
            interpolate(mount["source"], {})


def test_local_executors_split_the_cores() -> None:
    cores = os.cpu_count() or 1
    assert StackConfig(num_executors=2).torch_threads == max(1, cores // 2)
    assert StackConfig(num_executors=4 * cores).torch_threads == 1
    assert StackConfig(executor_torch_threads=3).torch_threads == 3
    assert CONTAINER_CONFIG.torch_threads is None


def test_local_defaults_reach_everything_on_the_loopback() -> None:
    default = StackConfig()
    assert default.host == "127.0.0.1" and not default.address_by_name
    assert default.redis_url == "redis://127.0.0.1:6379/0"
    for p in stack_processes(default):
        assert "--advertise-address" not in p.argv


def test_the_router_serves_its_admin_port_on_every_interface(specs: dict[str, ProcessSpec]) -> None:
    """Prometheus reaches router:8001 over the compose network: the admin listener binds what
    the public one does."""
    router = specs["router"]
    settings = service_flags.parse(router.argv[2], router.argv[3:], router.env)
    assert (settings.port, settings.admin_port) == (
        CONTAINER_CONFIG.router_port,
        CONTAINER_CONFIG.router_admin_port,
    )
    assert settings.admin_host == "" and settings.host == "0.0.0.0"
    assert router.health == HealthCheck("http", CONTAINER_CONFIG.router_port, "/health")


def test_python_services_accept_every_flag(specs: dict[str, ProcessSpec]) -> None:
    for name, spec in specs.items():
        if name == "redis":
            continue
        settings = service_flags.parse(spec.argv[2], spec.argv[3:], spec.env)
        assert settings.host == "0.0.0.0"
        assert settings.redis_url == "redis://redis:6379/0"
        if name.startswith("executor-"):
            assert settings.memory_manager == "memory-manager:50051"
            assert settings.resolved_advertise_address(settings.port) == f"{name}:{settings.port}"
            assert settings.executor_id == name


def test_only_the_router_and_grafana_publish_ports_on_the_loopback(doc: dict[str, Any]) -> None:
    """Clients reach the router only (its API, and its admin port for operators); Grafana is
    an operator UI on 127.0.0.1. Nothing else."""
    published = {name: s["ports"] for name, s in doc["services"].items() if "ports" in s}
    assert published == {
        "router": ["127.0.0.1:8000:8000/tcp", "127.0.0.1:8001:8001/tcp"],
        "grafana": ["127.0.0.1:3000:3000/tcp"],
    }
    assert not any("expose" in s for s in doc["services"].values())


def test_dependencies_wait_for_healthy_services(
    doc: dict[str, Any], specs: dict[str, ProcessSpec]
) -> None:
    names = list(doc["services"])
    for name in specs:
        service = doc["services"][name]
        assert "healthcheck" in service, name
        depends_on = service.get("depends_on", {})
        assert list(depends_on) == list(specs[name].depends_on)
        for dep, condition in depends_on.items():
            assert condition == {"condition": "service_healthy"}
            assert names.index(dep) < names.index(name), f"{name} depends on later {dep}"
    assert set(doc["services"]["router"]["depends_on"]) == {
        "redis",
        "memory-manager",
        "executor-0",
        "executor-1",
    }


def test_healthchecks_probe_each_service_on_its_own_port(doc: dict[str, Any]) -> None:
    c = CONTAINER_CONFIG
    tests = {name: s["healthcheck"]["test"] for name, s in doc["services"].items()}
    check = ["CMD", "python", "-m", "services.common.healthcheck"]
    assert tests["redis"] == ["CMD", "redis-cli", "-p", str(c.redis_port), "ping"]
    assert tests["memory-manager"] == [*check, "grpc", f"127.0.0.1:{c.memory_manager_port}"]
    assert tests["executor-1"] == [*check, "grpc", f"127.0.0.1:{c.executor_base_port + 1}"]
    assert tests["router"] == [*check, "http", f"http://127.0.0.1:{c.router_port}/health"]


def test_models_are_a_mounted_volume(doc: dict[str, Any]) -> None:
    mount = {"type": "volume", "source": "models", "target": "/models"}
    for name in ("executor-0", "executor-1", "router"):
        assert doc["services"][name]["volumes"] == [mount]
    assert "volumes" not in doc["services"]["memory-manager"]
    assert doc["volumes"] == {"models": {}, "prometheus-data": {}}


def test_fragments_add_services_but_cannot_replace_stack_ones(tmp_path: Path) -> None:
    (tmp_path / "monitoring.yaml").write_text(
        "services:\n  prometheus:\n    image: prom/prometheus\nvolumes:\n  prometheus-data: {}\n"
    )
    doc = compose.compose_document(fragments_dir=tmp_path)
    assert list(doc["services"])[-1] == "prometheus"
    assert doc["volumes"] == {"models": {}, "prometheus-data": {}}
    jsonschema.Draft7Validator(SCHEMA).validate(doc)
    (tmp_path / "zz-clash.yaml").write_text("services:\n  router:\n    image: other\n")
    with pytest.raises(ValueError, match="services.router is already defined"):
        compose.compose_document(fragments_dir=tmp_path)


def test_monitoring_images_are_pinned_and_mounts_exist(doc: dict[str, Any]) -> None:
    for name in FRAGMENT_SERVICES:
        service = doc["services"][name]
        image, _, tag = service["image"].partition(":")
        assert tag and tag != "latest", name
        assert "healthcheck" in service and service["restart"] == "unless-stopped", name
        for mount in service.get("volumes", []):
            if mount["type"] == "bind":
                assert mount["read_only"] is True, (name, mount)
                assert (REPO / mount["source"]).exists(), (name, mount)
            else:
                assert mount["source"] in doc["volumes"], (name, mount)


def test_prometheus_scrapes_every_metrics_port_of_the_stack(
    doc: dict[str, Any], specs: dict[str, ProcessSpec]
) -> None:
    prometheus = doc["services"]["prometheus"]
    binds = {m["target"]: m["source"] for m in prometheus["volumes"] if m["type"] == "bind"}
    config = binds["/etc/prometheus/prometheus.yml"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    scrape = yaml.safe_load((REPO / config).read_text())
    # The alert rules, mounted where the config's relative rule_files entry points.
    assert [binds[f"/etc/prometheus/{f}"] for f in scrape["rule_files"]] == [
        "./deploy/prometheus/alerts.yml"
    ]
    targets = {
        t
        for job in scrape["scrape_configs"]
        for static in job["static_configs"]
        for t in static["targets"]
    }
    expected = {f"router:{CONTAINER_CONFIG.router_admin_port}"}  # /metrics: the admin port
    for name, spec in specs.items():
        if "--metrics-port" in spec.argv:
            expected.add(f"{name}:{spec.argv[spec.argv.index('--metrics-port') + 1]}")
    assert targets == expected
    assert "ports" not in prometheus


def test_grafana_is_provisioned_with_the_dashboard_and_prometheus(doc: dict[str, Any]) -> None:
    grafana = doc["services"]["grafana"]
    mounts = {m["target"]: REPO / m["source"] for m in grafana["volumes"]}
    provisioning = mounts["/etc/grafana/provisioning"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "quire.yml").read_text())[
        "providers"
    ]
    dashboards = mounts[provider["options"]["path"]]
    assert (dashboards / "quire.json").is_file()
    env = grafana["environment"]
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"].startswith(provider["options"]["path"])
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090"  # the prometheus service, its default port
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    # The admin password comes from the environment, with no default: unset, compose refuses.
    assert env["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")


def test_compose_1_x_can_read_it(doc: dict[str, Any]) -> None:
    """Debian's docker-compose 1.29 (`make compose-up`) rejects a top-level `name`, healthcheck
    `start_interval` and long-form ports with `host_ip`; the file uses none of them."""
    assert "name" not in doc
    for name, service in doc["services"].items():
        assert "start_interval" not in service.get("healthcheck", {}), name
        assert all(isinstance(port, str) for port in service.get("ports", [])), name
    assert compose.PROJECT_NAME == "quire"


def test_debian_override_replaces_only_the_images_that_cannot_be_pulled(
    doc: dict[str, Any],
) -> None:
    override = yaml.safe_load((REPO / "deploy" / "compose.debian.yaml").read_text())
    jsonschema.Draft7Validator(SCHEMA).validate(override)
    assert override["services"] == {
        "redis": {"image": "quire-redis:bookworm"},
        "prometheus": {"image": "quire-prometheus:bookworm"},
    }
    dockerfile = (REPO / "deploy" / "docker" / "Dockerfile.debian").read_text()
    for name in override["services"]:
        assert f"AS {name}\n" in dockerfile
        # The compose health check's binary is in the Debian image too.
        binary = doc["services"][name]["healthcheck"]["test"][1]
        assert binary in dockerfile, (name, binary)


def test_docker_stop_waits_longer_than_each_service_drains(doc: dict[str, Any]) -> None:
    from services.executor.executor_settings import ExecutorSettings
    from services.router.router_settings import RouterSettings

    def seconds(value: str) -> float:
        assert value.endswith("s"), value
        return float(value[:-1])

    services = doc["services"]
    drain_s = ExecutorSettings.model_fields["drain_timeout_s"].default
    router_grace_s = RouterSettings.model_fields["shutdown_grace_s"].default
    for name, service in services.items():
        if name.startswith("executor-"):
            assert seconds(service["stop_grace_period"]) > drain_s, name
    assert seconds(services["router"]["stop_grace_period"]) > router_grace_s
