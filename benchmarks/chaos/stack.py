"""One fresh stack per chaos scenario on free ports, and how long its load runs."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.chaos.cluster import blocks_leaked, cluster_status, wait_healthy
from benchmarks.chaos.load import ACTIVE, Load, tally
from services.stack.ports import free_port, stack_ports
from services.stack.runner import Stack
from services.stack.spec import StackConfig

REPO = Path(__file__).resolve().parents[2]


def make_config(
    num_executors: int = 2,
    num_kv_blocks: int = 512,
    max_pending_per_executor: int = 24,
    max_pending_total: int = 40,
) -> StackConfig:
    """A stack on free ports (executor ports are consecutive from a free base)."""
    ports = stack_ports(num_executors)
    return StackConfig(
        model=str(REPO / "models" / "quire-tiny"),
        **ports,
        num_executors=num_executors,
        num_kv_blocks=num_kv_blocks,
        max_pending_per_executor=max_pending_per_executor,
        max_pending_total=max_pending_total,
        redis_prefix=f"quire-chaos-{ports['executor_base_port']}",
        python=sys.executable,
    )


def add_router(stack: Stack, name: str) -> str:
    """A second router replica: the first one's command on another port, without an admin
    port; its URL."""
    first = stack.specs["router"]
    port = free_port()
    argv = list(first.argv)
    argv[argv.index("--port") + 1] = str(port)
    argv[argv.index("--admin-port") + 1] = "0"
    url = f"http://{stack.config.host}:{port}"
    stack.specs[name] = dataclasses.replace(
        first, name=name, argv=argv, ready=("http", f"{url}/health")
    )
    return url


@dataclass
class Plan:
    """How long the load runs around a fault."""

    concurrency: int = 6
    before_s: float = 3.0  # steady load before the fault
    after_s: float = 6.0  # load after the fault (and the restart)
    soak_requests: int = 400
    overload_s: float = 10.0
    unloaded_samples: int = 50  # sequential requests whose TTFT p99 is the unloaded reference
    fault_rounds: int = 3  # a migration fault strikes this many times, each after before_s


QUICK = Plan(
    concurrency=4,
    before_s=1.5,
    after_s=3.0,
    soak_requests=60,
    overload_s=4.0,
    unloaded_samples=12,
    fault_rounds=1,
)


async def with_stack(
    config: StackConfig, run_dir: Path, body: Callable[[Stack], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """Start a stack from `config`, wait for its executors, run `body`, stop the stack."""
    shutil.rmtree(run_dir, ignore_errors=True)  # logs of this run only
    stack = Stack(config, run_dir, cwd=REPO)
    await asyncio.to_thread(stack.start, 120.0)
    try:
        return await on_stack(stack, body)
    finally:
        await asyncio.to_thread(stack.stop)


async def on_stack(
    stack: Stack, body: Callable[[Stack], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """Run `body` on a started stack once its executors are healthy; no load outlives it."""
    try:
        await wait_healthy(stack.config.router_admin_url, stack.config.num_executors)
        return await body(stack)
    finally:
        for load in list(ACTIVE):
            load.cancel()


async def steady_load(stack: Stack, plan: Plan, seed: int, urls: list[str] | None = None) -> Load:
    """Closed-loop load, started and left to run `plan.before_s`: what a fault interrupts."""
    load = Load(urls or [stack.config.router_url], concurrency=plan.concurrency, seed=seed)
    load.start()
    await asyncio.sleep(plan.before_s)
    return load


async def start_process(stack: Stack, name: str, timeout_s: float) -> None:
    """Start one process of the stack (again) and wait until it is ready."""
    await asyncio.to_thread(stack.start_one, name)
    await asyncio.to_thread(stack.wait_ready, name, timeout_s)


# An executor's fields of the router's /cluster/status that a leak report carries.
LEAK_FIELDS = ("id", "healthy", "num_running", "num_waiting", "kv_blocks_used", "kv_blocks_cached")


async def settle(load: Load, admin_url: str) -> dict[str, Any]:
    """Stop the load: its buckets, and the KV blocks still in use once the cluster is idle."""
    await load.finish()
    result: dict[str, Any] = tally(load.outcomes)
    result["blocks_leaked"] = await blocks_leaked(admin_url)
    if result["blocks_leaked"]:
        # What each executor's record said then, for whoever reads the failure.
        with contextlib.suppress(httpx.HTTPError):
            result["leak_detail"] = [
                {k: e.get(k) for k in LEAK_FIELDS} for e in await cluster_status(admin_url)
            ]
    return result
