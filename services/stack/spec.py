"""The process list of a Quire stack: Redis, a memory manager, executors, the router.

`make up`, the integration tests and compose.yaml (`python -m services.stack compose`) all
take their commands from `stack_processes`, so the ways of running Quire cannot drift apart.
The local defaults bind 127.0.0.1 and reach every process there; `CONTAINER_CONFIG` describes
the same stack as containers: bound on 0.0.0.0 and reached at their service names.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

# Fields the services themselves read, under the services' own variable names: the one way to
# choose the model, its KV pool and dtype, the same for `make up`, compose and Kubernetes
# (docs/configuration.md, "Choosing the model"). Every other field is QUIRE_STACK_<FIELD>.
SERVICE_VARIABLES = {
    "model": "QUIRE_MODEL",
    "num_kv_blocks": "QUIRE_NUM_KV_BLOCKS",
    "executor_dtype": "QUIRE_DTYPE",
}


def env_variable(name: str) -> str:
    """The environment variable of StackConfig field `name`."""
    return SERVICE_VARIABLES.get(name, f"QUIRE_STACK_{name.upper()}")


def _parse_env(variable: str, kind: str, raw: str) -> object:
    try:
        if kind == "bool":
            return raw.lower() in ("1", "true", "yes", "on")
        if kind == "int":
            return int(raw)
        if kind == "int | None":
            return int(raw) if raw.strip() else None
    except ValueError:
        raise ValueError(f"{variable}={raw!r} is not an integer") from None
    return raw


@dataclass(frozen=True)
class StackConfig:
    """Ports and sizes of a local stack. Each field has an environment variable: QUIRE_MODEL,
    QUIRE_NUM_KV_BLOCKS and QUIRE_DTYPE (the services' own), QUIRE_STACK_<FIELD> for the rest."""

    host: str = "127.0.0.1"  # every process binds here
    # Containers: processes reach each other at their names (redis, memory-manager,
    # executor-N) instead of at `host`, and executors advertise that name to routers.
    address_by_name: bool = False
    # checkpoint the executors serve and the router tokenizes with (docs/configuration.md)
    model: str = "models/smollm2-135m-instruct"
    router_port: int = 8000  # the only port meant for clients: /v1/*, /health
    router_admin_port: int = 8001  # the router's /metrics, /dashboard, /cluster/status, /docs
    redis_port: int = 6379  # redis-server's port
    memory_manager_port: int = 50051  # the memory manager's gRPC port
    executor_base_port: int = 50061  # executor i listens on base + i
    memory_manager_metrics_port: int = 9151  # Prometheus /metrics of the memory manager
    executor_base_metrics_port: int = 9161  # executor i serves /metrics on base + i
    num_executors: int = 2  # executor processes, each with its own KV pool
    # KV blocks per executor; unset: each executor sizes its pool from memory
    num_kv_blocks: int | None = None
    # torch CPU threads per executor; 0: this machine's cores split evenly between executors;
    # -1: no flag, the executor's own setting (QUIRE_TORCH_THREADS, else torch's default)
    executor_torch_threads: int = 0
    # Pin executor i to CPU core i % cores (taskset), so executors share the cores evenly
    # instead of the scheduler's whim; for benchmarks, with executor_torch_threads=1.
    pin_executors: bool = False
    # Executors split the cores by who has work (their --share-cores-file, one per stack in
    # /dev/shm): alone, an executor's steps run on every core; with siblings busy, on an even
    # share. Only with the even split (torch threads 0), unpinned executors, as processes.
    executor_share_cores: bool = True
    routing_policy: str = "prefix"  # the router's --routing-policy
    # Executors copy a prompt's blocks a peer holds instead of computing them (--enable-pulls)
    executor_enable_pulls: bool = True
    # The prefix policy counts blocks a peer holds at a pull's cost (--routing-pulls); only
    # meaningful when the executors pull
    router_routing_pulls: bool = True
    executor_dtype: str = "auto"  # the executors' dtype
    # Executor i's --role is the i-th of these, comma separated ("prefill,decode"); empty:
    # every executor takes both phases. Fewer roles than executors: the rest take both.
    executor_roles: str = ""
    max_pending_per_executor: int = 256  # router admission: in-flight requests per executor
    max_pending_total: int = 1024  # router admission: in-flight requests overall
    redis_prefix: str = "quire"  # prefix of every Redis key the stack's services write
    python: str = sys.executable  # interpreter for the Python services
    redis_server: str = "redis-server"  # the Redis binary

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> StackConfig:
        """The config `environ` (default: os.environ) describes, then `overrides`. ValueError
        for a value that is not of its field's type, or a variable of the wrong name."""
        env = os.environ if environ is None else environ
        for name, variable in SERVICE_VARIABLES.items():
            if f"QUIRE_STACK_{name.upper()}" in env:
                raise ValueError(
                    f"QUIRE_STACK_{name.upper()} is not read: set {variable}, which the "
                    "services read too (docs/configuration.md)"
                )
        values: dict[str, object] = {}
        for name, f in cls.__dataclass_fields__.items():
            variable = env_variable(name)
            raw = env.get(variable)
            # The services' variables: empty is unset, as compose's ${QUIRE_MODEL:-...} reads it
            if raw is None or (name in SERVICE_VARIABLES and not raw.strip()):
                continue
            values[name] = _parse_env(variable, str(f.type), raw)
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    @property
    def executor_env(self) -> dict[str, str]:
        """What the executors are told through their own variables (SERVICE_VARIABLES)."""
        return {
            "QUIRE_MODEL": self.model,
            "QUIRE_NUM_KV_BLOCKS": "" if self.num_kv_blocks is None else str(self.num_kv_blocks),
            "QUIRE_DTYPE": self.executor_dtype,
        }

    def address(self, name: str) -> str:
        """Where the other processes reach process `name`."""
        return name if self.address_by_name else self.host

    @property
    def torch_threads(self) -> int | None:
        """Threads each executor runs torch with (None: left to the executor)."""
        if self.executor_torch_threads < 0:
            return None
        if self.executor_torch_threads:
            return self.executor_torch_threads
        return max(1, (os.cpu_count() or 1) // max(1, self.num_executors))

    @property
    def shares_cores(self) -> bool:
        """Whether the executors split the cores by who has work (executor_share_cores)."""
        return (
            self.executor_share_cores
            and self.executor_torch_threads == 0
            and not self.pin_executors
            and not self.address_by_name  # containers: each has cores of its own
            and self.num_executors > 1
        )

    @property
    def share_cores_file(self) -> str:
        """The stack's shared cores file: one per stack (its executor ports)."""
        return f"/dev/shm/{self.redis_prefix}-cores-{self.executor_base_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.address('redis')}:{self.redis_port}/0"

    @property
    def router_url(self) -> str:
        return f"http://{self.host}:{self.router_port}"

    @property
    def router_admin_url(self) -> str:
        """The router's operational endpoints (/metrics, /cluster/status, /dashboard, /docs)."""
        return f"http://{self.host}:{self.router_admin_port}"


# The same stack as containers (compose.yaml): each process in its own network namespace,
# the model baked into the image (or mounted) at /models, `python` the image's interpreter.
CONTAINER_CONFIG = StackConfig(
    host="0.0.0.0",
    address_by_name=True,
    model="/models/smollm2-135m-instruct",
    # A container's core count is its own business: QUIRE_TORCH_THREADS in its environment.
    executor_torch_threads=-1,
    python="python",
    redis_server="redis-server",
)


@dataclass(frozen=True)
class HealthCheck:
    """How a process reports health from inside its container (compose healthchecks)."""

    kind: str  # "redis" (PING), "grpc" (grpc.health.v1 Check) or "http" (GET path, 200)
    port: int
    path: str = ""  # for "http"


@dataclass(frozen=True)
class ProcessSpec:
    """One process of the stack."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # How readiness is checked: ("tcp", port) or ("http", url).
    ready: tuple[str, str] = ("tcp", "")
    # Processes that must be healthy before this one starts (all come earlier in the list).
    depends_on: tuple[str, ...] = ()
    health: HealthCheck | None = None


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
            health=HealthCheck("redis", c.redis_port),
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
            depends_on=("redis",),
            health=HealthCheck("grpc", c.memory_manager_port),
        ),
    ]
    executors = [f"executor-{i}" for i in range(c.num_executors)]
    for i, name in enumerate(executors):
        port = c.executor_base_port + i
        argv = [
            c.python,
            "-m",
            "services.executor",
            "--host",
            c.host,
            "--port",
            str(port),
            "--executor-id",
            name,
            "--memory-manager",
            f"{c.address('memory-manager')}:{c.memory_manager_port}",
            "--redis-url",
            c.redis_url,
            "--redis-prefix",
            c.redis_prefix,
            "--metrics-port",
            str(c.executor_base_metrics_port + i),
        ]
        if c.torch_threads is not None:
            argv += ["--torch-threads", str(c.torch_threads)]
        if c.shares_cores:
            argv += [
                "--share-cores-file",
                c.share_cores_file,
                "--share-cores-slot",
                str(i),
                "--share-cores-total",
                str(os.cpu_count() or 1),
            ]
        if not c.executor_enable_pulls:
            argv += ["--no-enable-pulls"]
        roles = [r.strip() for r in c.executor_roles.split(",") if r.strip()]
        if i < len(roles):
            argv += ["--role", roles[i]]
        if c.pin_executors:
            argv = ["taskset", "-c", str(i % (os.cpu_count() or 1)), *argv]
        if c.address_by_name:
            # Routers dial what the executor advertises; a container's hostname is not
            # its service name, so name it explicitly.
            argv += ["--advertise-address", f"{c.address(name)}:{port}"]
        procs.append(
            ProcessSpec(
                name,
                argv,
                env=c.executor_env,
                ready=("tcp", str(port)),
                depends_on=("redis", "memory-manager"),
                health=HealthCheck("grpc", port),
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
                "--admin-port",
                str(c.router_admin_port),
                "--redis-url",
                c.redis_url,
                "--redis-prefix",
                c.redis_prefix,
                "--max-pending-per-executor",
                str(c.max_pending_per_executor),
                "--max-pending-total",
                str(c.max_pending_total),
                "--memory-manager",
                f"{c.address('memory-manager')}:{c.memory_manager_port}",
                *(["--routing-policy", c.routing_policy] if c.routing_policy != "prefix" else []),
                *([] if c.router_routing_pulls else ["--no-routing-pulls"]),
            ],
            env={"QUIRE_MODEL": c.model},  # the executors' model: its tokenizer and name
            ready=("http", f"{c.router_url}/health"),
            depends_on=("redis", "memory-manager", *executors),
            health=HealthCheck("http", c.router_port, "/health"),
        )
    )
    return procs
