"""A real stack (redis-server, memory manager, two executors, router) on free ports."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from quire.config import cpu_has_native_bf16
from services.stack.ports import stack_ports
from services.stack.runner import Stack
from services.stack.spec import StackConfig

REPO = Path(__file__).resolve().parents[2]
# What `auto` serves on this CPU (bfloat16 where it multiplies bfloat16 in hardware, else
# float32), pinned, so that offline references can run in the same dtype.
STACK_DTYPE = "bfloat16" if cpu_has_native_bf16() else "float32"


@contextmanager
def running_stack(
    config: StackConfig, run_dir: Path, start_timeout_s: float = 120, healthy_timeout_s: float = 30
) -> Iterator[Stack]:
    """`config`'s stack, started, with every executor healthy at the router; stopped after."""
    s = Stack(config, run_dir, cwd=REPO)
    try:
        s.start(timeout_s=start_timeout_s)
        wait_for_executors(s, config.num_executors, timeout_s=healthy_timeout_s)
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    ports = stack_ports(2)
    config = StackConfig(
        model=str(REPO / "models" / "quire-tiny"),
        **ports,
        num_executors=2,
        num_kv_blocks=512,
        executor_dtype=STACK_DTYPE,
        max_pending_per_executor=24,
        max_pending_total=40,
        redis_prefix=f"quire-test-{ports['executor_base_port']}",
    )
    with running_stack(config, tmp_path_factory.mktemp("stack")) as s:
        yield s


def wait_for_executors(s: Stack, n: int, timeout_s: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    healthy: list[dict] = []
    while time.monotonic() < deadline:
        status = httpx.get(f"{s.config.router_admin_url}/cluster/status").json()
        healthy = [e for e in status["executors"] if e["healthy"]]
        if len(healthy) >= n:
            return healthy
        time.sleep(0.2)
    raise AssertionError(f"only {len(healthy)} healthy executors after {timeout_s} s")


def wait_idle(s: Stack, timeout_s: float = 20.0) -> list[dict]:
    """Until no executor runs or holds anything; returns the final executor list."""
    deadline = time.monotonic() + timeout_s
    executors: list[dict] = []
    while time.monotonic() < deadline:
        executors = httpx.get(f"{s.config.router_admin_url}/cluster/status").json()["executors"]
        live = [e for e in executors if e["healthy"]]
        if live and all(e["num_running"] == 0 and e["kv_blocks_used"] == 0 for e in live):
            return executors
        time.sleep(0.25)
    raise AssertionError(f"cluster never went idle: {executors}")
