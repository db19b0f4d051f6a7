"""compose.yaml, rendered from the same process list as `make up` (`stack_processes`).

Each process becomes one Compose service with the same argv (image entrypoint + command) and
the same environment, `CONTAINER_CONFIG` mapping 127.0.0.1 to 0.0.0.0 / service names. The
variables that choose the model (QUIRE_MODEL, QUIRE_NUM_KV_BLOCKS, QUIRE_DTYPE) are written as
`${NAME:-default}`, so `QUIRE_MODEL=... docker compose up` reaches the router and the executors
alike. Only the router publishes ports: its public one and its admin one. Services that are not part of the stack (Prometheus, Grafana,
...) go in `deploy/compose/*.yaml` fragments: their `services`, `volumes`, `networks`,
`configs` and `secrets` are merged in, file by file, in name order.

    python -m services.stack compose           # rewrite compose.yaml (`make compose`)
    python -m services.stack compose --check   # exit 1 if compose.yaml is stale
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

import yaml

from services.stack.spec import (
    CONTAINER_CONFIG,
    SERVICE_VARIABLES,
    HealthCheck,
    ProcessSpec,
    StackConfig,
    stack_processes,
)

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose.yaml"
FRAGMENTS_DIR = REPO / "deploy" / "compose"

# The project name (container, network and volume prefix) that the make targets pass as
# COMPOSE_PROJECT_NAME; not written as a top-level `name:`, which Compose 1.x rejects.
PROJECT_NAME = "quire"
REDIS_IMAGE = "redis:7.4-alpine"
IMAGE_VARIANT = "cpu"  # Dockerfile VARIANT; deploy/compose.gpu.yaml switches executors to cuda
MODELS_VOLUME = "models"  # named volume, filled from the image's /models on first start
PUBLISH_HOST_IP = "127.0.0.1"  # host address the router's ports are published on
# How long `docker stop` waits after SIGTERM before it kills: above each service's own grace.
EXECUTOR_STOP_GRACE = "330s"  # executors drain for up to --drain-timeout-s (300 s) on SIGTERM
ROUTER_STOP_GRACE = "40s"  # routers finish open streams for up to --shutdown-grace-s (30 s)
FRAGMENT_KEYS = ("services", "volumes", "networks", "configs", "secrets")

HEADER = (
    "# Generated from services/stack/spec.py by `make compose`: do not edit by hand.\n"
    "# The same process list as `make up`. Add other services in deploy/compose/*.yaml.\n"
    "# docker compose -p quire up --build   # router on http://127.0.0.1:8000 (admin: 8001)\n"
    "# QUIRE_MODEL, QUIRE_NUM_KV_BLOCKS and QUIRE_DTYPE choose the model, its KV pool and dtype;\n"
    "# a checkpoint on this machine: add -f deploy/compose.model.yaml (docs/configuration.md).\n"
)


def image_target(spec: ProcessSpec) -> str | None:
    """The Dockerfile target of a `python -m services.<name>` process (None: not ours)."""
    if len(spec.argv) >= 3 and spec.argv[1] == "-m" and spec.argv[2].startswith("services."):
        return spec.argv[2].removeprefix("services.").replace("_", "-")
    return None


def healthcheck_test(health: HealthCheck, python: str) -> list[str]:
    """The container-side check of one process, as a compose `test` list."""
    if health.kind == "redis":
        return ["CMD", "redis-cli", "-p", str(health.port), "ping"]
    check = [python, "-m", "services.common.healthcheck"]
    if health.kind == "grpc":
        return ["CMD", *check, "grpc", f"127.0.0.1:{health.port}"]
    if health.kind == "http":
        return ["CMD", *check, "http", f"http://127.0.0.1:{health.port}{health.path}"]
    raise ValueError(f"unknown health check kind {health.kind!r}")


def published_ports(c: StackConfig) -> dict[str, list[int]]:
    """The only ports reachable from the host: process name -> ports (the router's public
    HTTP port and its admin port, both on the host's loopback)."""
    return {"router": [c.router_port, c.router_admin_port]}


def environment_value(name: str, value: str) -> str:
    """A variable that chooses the model as `${NAME:-value}` (the caller's value, else the
    stack's); any other as it is."""
    if name in SERVICE_VARIABLES.values():
        return f"${{{name}:-{value}}}"
    return value


def compose_service(spec: ProcessSpec, c: StackConfig) -> dict[str, Any]:
    """One process as a Compose service."""
    service: dict[str, Any] = {}
    target = image_target(spec)
    if target is None:
        service["image"] = REDIS_IMAGE
        service["command"] = list(spec.argv)
    else:
        service["image"] = f"quire-{target}:{IMAGE_VARIANT}"
        service["build"] = {"context": ".", "target": target, "args": {"VARIANT": IMAGE_VARIANT}}
        service["entrypoint"] = list(spec.argv[:3])  # equals the image's ENTRYPOINT
        service["command"] = list(spec.argv[3:])
    if spec.env:
        service["environment"] = {k: environment_value(k, v) for k, v in spec.env.items()}
    if "QUIRE_MODEL" in spec.env:
        service["volumes"] = [
            {"type": "volume", "source": MODELS_VOLUME, "target": posixpath.dirname(c.model)}
        ]
    ports = published_ports(c).get(spec.name)
    if ports:
        # The short form: Compose 1.x has no `host_ip` in the long one.
        service["ports"] = [f"{PUBLISH_HOST_IP}:{port}:{port}/tcp" for port in ports]
    if spec.depends_on:
        service["depends_on"] = {name: {"condition": "service_healthy"} for name in spec.depends_on}
    if spec.health is not None:
        slow_start = spec.name.startswith("executor-")  # loads the model before serving
        service["healthcheck"] = {
            "test": healthcheck_test(spec.health, c.python),
            "interval": "5s",
            "timeout": "3s",
            "retries": 3,
            # No `start_interval`: Compose 1.x rejects it and Engines before 25 ignore it.
            "start_period": "600s" if slow_start else "60s",
        }
    if spec.name.startswith("executor-"):
        service["stop_grace_period"] = EXECUTOR_STOP_GRACE
    if spec.name == "router":
        service["stop_grace_period"] = ROUTER_STOP_GRACE
    service["restart"] = "unless-stopped"
    return service


def load_fragments(fragments_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """(file name, mapping) of every deploy/compose/*.yaml fragment, in name order."""
    fragments = []
    for path in sorted(fragments_dir.glob("*.yaml")) if fragments_dir.is_dir() else []:
        doc = yaml.safe_load(path.read_text()) or {}
        unknown = set(doc) - set(FRAGMENT_KEYS)
        if unknown:
            raise ValueError(f"{path.name}: only {', '.join(FRAGMENT_KEYS)} may be added")
        fragments.append((path.name, doc))
    return fragments


def compose_document(
    c: StackConfig = CONTAINER_CONFIG, fragments_dir: Path = FRAGMENTS_DIR
) -> dict[str, Any]:
    """The whole compose file as a mapping: the stack's services, then the fragments'."""
    specs = stack_processes(c)
    doc: dict[str, Any] = {
        "services": {spec.name: compose_service(spec, c) for spec in specs},
        "volumes": {MODELS_VOLUME: {}},
    }
    for file_name, fragment in load_fragments(fragments_dir):
        for key in FRAGMENT_KEYS:
            for name, value in (fragment.get(key) or {}).items():
                section = doc.setdefault(key, {})  # no empty top-level sections
                if name in section:
                    raise ValueError(f"{file_name}: {key}.{name} is already defined")
                section[name] = value
    return doc


class _Dumper(yaml.SafeDumper):
    """Block style, except short lists of scalars (entrypoints, healthcheck tests): one line."""


def _represent_list(dumper: yaml.SafeDumper, items: list[Any]) -> yaml.Node:
    scalars = all(not isinstance(item, dict | list) for item in items)
    flow = scalars and sum(len(str(item)) + 2 for item in items) <= 72
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def render(c: StackConfig = CONTAINER_CONFIG, fragments_dir: Path = FRAGMENTS_DIR) -> str:
    """compose.yaml's exact text."""
    body = yaml.dump(compose_document(c, fragments_dir), Dumper=_Dumper, sort_keys=False, width=100)
    return HEADER + body
