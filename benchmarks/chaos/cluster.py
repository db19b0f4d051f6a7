"""What the cluster says about itself during chaos: health, KV blocks in use, Redis records,
the memory manager's pools, peak memory and the router's request log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import redis

from quire.cluster.redis_keys import ExecutorRecord, executor_key
from services.rpc import memory_manager_pb2, memory_manager_pb2_grpc
from services.stack.runner import Stack


async def cluster_status(admin_url: str) -> list[dict[str, Any]]:
    """The router's view of every executor (GET /cluster/status on its admin port)."""
    async with httpx.AsyncClient(timeout=5) as client:
        executors: list[dict[str, Any]] = (await client.get(f"{admin_url}/cluster/status")).json()[
            "executors"
        ]
        return executors


async def wait_healthy(admin_url: str, n: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Wait until the router sees `n` healthy executors; those executors."""
    deadline = time.monotonic() + timeout_s
    healthy: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            healthy = [e for e in await cluster_status(admin_url) if e["healthy"]]
            if len(healthy) >= n:
                return healthy
        await asyncio.sleep(0.2)
    raise RuntimeError(f"only {len(healthy)} healthy executors after {timeout_s} s")


async def until_serving(admin_url: str, executor_id: str, timeout_s: float = 10.0) -> bool:
    """Wait (a bounded time) until the router sees `executor_id` running sequences, so that a
    fault lands on streams rather than between them; whether it did."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            for e in await cluster_status(admin_url):
                if e["id"] == executor_id and e["num_running"] > 0:
                    return True
        await asyncio.sleep(0.02)
    return False


async def blocks_leaked(admin_url: str, timeout_s: float = 20.0) -> int:
    """kv_blocks_used summed over live executors once idle (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    used = -1
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            live = [e for e in await cluster_status(admin_url) if e["healthy"]]
            used = sum(e["kv_blocks_used"] for e in live)
            if live and used == 0 and all(e["num_running"] == 0 for e in live):
                return 0
        await asyncio.sleep(0.25)
    return used


def redis_client(stack: Stack) -> redis.Redis:
    """A synchronous client of the stack's Redis."""
    return redis.Redis(host=stack.config.host, port=stack.config.redis_port, socket_timeout=2)


def executor_record(stack: Stack, executor_id: str) -> ExecutorRecord | None:
    """The executor's liveness record in Redis, None if it is missing."""
    with contextlib.suppress(redis.RedisError):
        data = redis_client(stack).get(executor_key(stack.config.redis_prefix, executor_id))
        if isinstance(data, bytes):
            return ExecutorRecord.decode(data)
    return None


def manager_pools(stack: Stack, executor_ids: list[str]) -> dict[str, dict[str, int]]:
    """Each executor's pool at the memory manager, checked for consistency."""
    target = f"{stack.config.host}:{stack.config.memory_manager_port}"
    pools: dict[str, dict[str, int]] = {}
    with grpc.insecure_channel(target) as channel:
        stub = memory_manager_pb2_grpc.MemoryManagerStub(channel)
        for eid in executor_ids:
            states = stub.GetBlockStates(
                memory_manager_pb2.GetBlockStatesRequest(executor_id=eid), timeout=5
            )
            s = states.stats
            counts = [0, 0, 0, 0]
            for b in states.states:
                counts[b] += 1
            pools[eid] = {
                "total": s.num_blocks_total,
                "used": s.num_blocks_used,
                "cached": s.num_blocks_cached,
                "free": counts[0],
                "preemptions": s.num_preemptions,
                # the per-block states agree with the counters and add up to the pool
                "consistent": int(
                    len(states.states) == s.num_blocks_total
                    and counts[1] + counts[3] == s.num_blocks_used
                    and counts[2] == s.num_blocks_cached
                ),
            }
    return pools


def peak_rss_kib(stack: Stack) -> dict[str, int]:
    """VmHWM of every live stack process."""
    peaks = {}
    for name, proc in stack.procs.items():
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks[name] = int(line.split()[1])
    return peaks


def router_durations_ms(stack: Stack, offset: int, status: int) -> list[float]:
    """duration_ms of the router's request log lines with `status`, from byte `offset`."""
    durations = []
    with stack.log_path("router").open("rb") as f:
        f.seek(offset)
        for line in f:
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("event") == "request" and entry.get("status") == status:
                    durations.append(float(entry["duration_ms"]))
    return durations
