"""A real stack (redis-server, memory manager, two executors, router) on free ports."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.stack.ports import stack_ports
from services.stack.runner import Stack
from services.stack.spec import StackConfig

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    ports = stack_ports(2)
    config = StackConfig(
        model=str(REPO / "models" / "quire-tiny"),
        **ports,
        num_executors=2,
        num_kv_blocks=512,
        max_pending_per_executor=24,
        max_pending_total=40,
        redis_prefix=f"quire-test-{ports['executor_base_port']}",
        python=sys.executable,
    )
    s = Stack(config, tmp_path_factory.mktemp("stack"), cwd=REPO)
    try:
        s.start(timeout_s=120)
        wait_for_executors(s, 2)
        yield s
    finally:
        s.stop()


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
