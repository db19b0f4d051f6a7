"""The process list of a Quire stack: Redis, a memory manager, executors, the router.

`make up`, the integration tests and (later) compose.yaml all take their commands from
`stack_processes`, so the ways of running Quire cannot drift apart.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StackConfig:
    """Ports and sizes of a local stack. Every field can be set by a QUIRE_STACK_* variable."""

    host: str = "127.0.0.1"  # every process binds here
    model: str = "models/quire-tiny"  # checkpoint served by executors, tokenizer for the router
    router_port: int = 8000  # the only port meant for clients
    redis_port: int = 6379
    memory_manager_port: int = 50051
    executor_base_port: int = 50061  # executor i listens on base + i
    memory_manager_metrics_port: int = 9151  # Prometheus /metrics of the memory manager
    executor_base_metrics_port: int = 9161  # executor i serves /metrics on base + i
    num_executors: int = 2
    num_kv_blocks: int = 2048  # per executor
    max_pending_per_executor: int = 256  # router admission: in-flight requests per executor
    max_pending_total: int = 1024  # router admission: in-flight requests overall
    redis_prefix: str = "quire"
    python: str = sys.executable  # interpreter for the Python services
    redis_server: str = "redis-server"

    @classmethod
    def from_env(cls, **overrides: object) -> StackConfig:
        values: dict[str, object] = {}
        for name, f in cls.__dataclass_fields__.items():
            env = os.environ.get(f"QUIRE_STACK_{name.upper()}")
            if env is not None:
                values[name] = int(env) if f.type == "int" else env
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    @property
    def redis_url(self) -> str:
        return f"redis://{self.host}:{self.redis_port}/0"

    @property
    def router_url(self) -> str:
        return f"http://{self.host}:{self.router_port}"


@dataclass(frozen=True)
class ProcessSpec:
    """One process of the stack."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # How readiness is checked: ("tcp", port) or ("http", url).
    ready: tuple[str, str] = ("tcp", "")


def stack_processes(c: StackConfig) -> list[ProcessSpec]:
    """Every process, in start order (each one's dependencies come before it)."""
    procs = [
        ProcessSpec(
            "redis",
            [
                c.redis_server,
                "--bind",
                c.host,
                "--port",
                str(c.redis_port),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            ready=("tcp", str(c.redis_port)),
        ),
        ProcessSpec(
            "memory-manager",
            [
                c.python,
                "-m",
                "services.memory_manager",
                "--host",
                c.host,
                "--port",
                str(c.memory_manager_port),
                "--redis-url",
                c.redis_url,
                "--redis-prefix",
                c.redis_prefix,
                "--metrics-port",
                str(c.memory_manager_metrics_port),
            ],
            ready=("tcp", str(c.memory_manager_port)),
        ),
    ]
    for i in range(c.num_executors):
        port = c.executor_base_port + i
        procs.append(
            ProcessSpec(
                f"executor-{i}",
                [
                    c.python,
                    "-m",
                    "services.executor",
                    "--host",
                    c.host,
                    "--port",
                    str(port),
                    "--executor-id",
                    f"executor-{i}",
                    "--model",
                    c.model,
                    "--memory-manager",
                    f"{c.host}:{c.memory_manager_port}",
                    "--redis-url",
                    c.redis_url,
                    "--redis-prefix",
                    c.redis_prefix,
                    "--num-kv-blocks",
                    str(c.num_kv_blocks),
                    "--metrics-port",
                    str(c.executor_base_metrics_port + i),
                ],
                ready=("tcp", str(port)),
            )
        )
    procs.append(
        ProcessSpec(
            "router",
            [
                c.python,
                "-m",
                "services.router",
                "--host",
                c.host,
                "--port",
                str(c.router_port),
                "--model",
                c.model,
                "--redis-url",
                c.redis_url,
                "--redis-prefix",
                c.redis_prefix,
                "--max-pending-per-executor",
                str(c.max_pending_per_executor),
                "--max-pending-total",
                str(c.max_pending_total),
            ],
            ready=("http", f"{c.router_url}/health"),
        )
    )
    return procs
