"""The faults of `make chaos`: each process killed or restarted under load, then checked."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import httpx

from benchmarks.chaos.cluster import executor_record, manager_pools, redis_client, wait_healthy
from benchmarks.chaos.load import one_request, served_by, stream_body
from benchmarks.chaos.stack import Plan, add_router, settle, start_process, steady_load
from benchmarks.pulls import first_token_s, pull_counters
from quire.cluster.redis_keys import prefix_key
from services.stack.runner import Stack


async def fault_kill_executor(stack: Stack, plan: Plan) -> dict[str, Any]:
    """SIGKILL an executor mid-stream, check rerouting, restart it, check it serves again."""
    url = stack.config.router_admin_url  # /cluster/status
    victim = "executor-1"
    epoch_before = executor_record(stack, victim)
    load = await steady_load(stack, plan, seed=1)
    t_kill = time.monotonic()
    stack.signal(victim, signal.SIGKILL)
    await asyncio.sleep(plan.after_s / 2)
    late = [o for o in served_by(load.outcomes_since(t_kill + 2.0), victim)]
    t_restart = time.monotonic()
    await start_process(stack, victim, 60.0)
    await wait_healthy(url, 2)
    t_back = time.monotonic()
    await asyncio.sleep(plan.after_s)
    result = await settle(load, url)
    after = executor_record(stack, victim)
    result["routed_to_dead_after_2s"] = len(late)
    result["restart_s"] = round(t_back - t_restart, 2)
    result["new_epoch"] = bool(epoch_before and after and after.epoch != epoch_before.epoch)
    result["served_after_restart"] = len(served_by(load.outcomes_since(t_back), victim))
    return result


async def kill_and_restart(stack: Stack, name: str, down_s: float, timeout_s: float) -> None:
    """SIGKILL a process, leave it down `down_s`, start it again and wait until it is ready."""
    stack.signal(name, signal.SIGKILL)
    await asyncio.sleep(down_s)
    await start_process(stack, name, timeout_s)


async def fault_kill_memory_manager(stack: Stack, plan: Plan) -> dict[str, Any]:
    """SIGKILL the memory manager mid-load and restart it."""
    url = stack.config.router_admin_url  # /cluster/status
    load = await steady_load(stack, plan, seed=2)
    await kill_and_restart(stack, "memory-manager", down_s=1.0, timeout_s=60.0)
    t_back = time.monotonic()
    await asyncio.sleep(plan.after_s)
    result = await settle(load, url)
    # Requests that finished after the manager was back: their last steps needed the new one.
    # (Counting only requests started after it is at the mercy of how long the in-flight
    # ones, which hold every load slot, take to drain on a busy machine.)
    result["completed_after_restart"] = sum(
        o.bucket == "completed" and o.end >= t_back for o in load.outcomes
    )
    result["started_and_completed_after_restart"] = sum(
        o.bucket == "completed" for o in load.outcomes_since(t_back)
    )
    result["reregistered"] = await reregistered(stack, ["executor-0", "executor-1"])
    return result


async def reregistered(stack: Stack, executor_ids: list[str], timeout_s: float = 15.0) -> list[str]:
    """The executors the restarted manager knows; an idle executor registers on its next
    step, so a few requests are sent meanwhile."""
    deadline = time.monotonic() + timeout_s
    known: list[str] = []
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() < deadline:
            known = []
            for eid in executor_ids:
                with contextlib.suppress(grpc.RpcError):
                    await asyncio.to_thread(manager_pools, stack, [eid])
                    known.append(eid)
            if known == executor_ids:
                break
            bodies = [
                {"kind": "plain", "body": {**stream_body(i), "stream": False}} for i in range(4)
            ]
            await asyncio.gather(
                *(one_request(client, stack.config.router_url, b, 10) for b in bodies)
            )
    return known


async def fault_restart_redis(stack: Stack, plan: Plan) -> dict[str, Any]:
    """SIGKILL Redis mid-load and restart it: no request fails; prefix sets come back."""
    url = stack.config.router_admin_url  # /cluster/status
    load = await steady_load(stack, plan, seed=3)
    await kill_and_restart(stack, "redis", down_s=2.0, timeout_s=30.0)
    await asyncio.sleep(plan.after_s)
    result = await settle(load, url)
    # the prefix index is republished into the fresh Redis (within a refresh period)
    deadline = time.monotonic() + 15.0
    republished: list[str] = []
    while time.monotonic() < deadline:
        republished = []
        for eid in ("executor-0", "executor-1"):
            record = executor_record(stack, eid)
            key = prefix_key(stack.config.redis_prefix, eid, record.epoch) if record else ""
            if key and redis_client(stack).exists(key):
                republished.append(eid)
        if len(republished) == 2:
            break
        await asyncio.sleep(0.5)
    result["prefix_sets_republished"] = republished
    return result


async def fault_rolling_update(stack: Stack, plan: Plan) -> dict[str, Any]:
    """SIGTERM one of two routers, then SIGTERM an executor: no accepted request lost."""
    url = stack.config.router_url
    second = add_router(stack, "router-1")
    await start_process(stack, "router-1", 60.0)
    load = await steady_load(stack, plan, seed=4, urls=[url, second])
    load.urls = [url]  # the load balancer takes the draining replica out of rotation
    stack.signal("router-1", signal.SIGTERM)
    await asyncio.sleep(plan.after_s / 2)
    stack.signal("executor-1", signal.SIGTERM)
    await asyncio.sleep(plan.after_s / 2)
    result = await settle(load, stack.config.router_admin_url)
    result["router_exit"] = stack.procs["router-1"].wait(15)
    result["executor_exit"] = stack.procs["executor-1"].wait(30)
    return result


async def fault_stop_pull_source(stack: Stack, plan: Plan) -> dict[str, Any]:
    """Freeze (SIGSTOP) the executor a pull comes from, mid-load: the puller gives up within
    its timeout and computes the prefix; no request fails and no pin outlives the fault."""
    url = stack.config.router_admin_url  # /cluster/status
    c = stack.config
    source = f"{c.host}:{c.executor_base_port}"
    destination = f"{c.host}:{c.executor_base_port + 1}"
    metrics = f"http://{c.host}:{c.executor_base_metrics_port + 1}/metrics"
    fallbacks = ("quire_executor_pull_fallbacks",)
    context = [(i * 37) % 4000 + 10 for i in range(200)]  # 12 full blocks of 16
    await asyncio.to_thread(first_token_s, source, "chaos-ctx", context)
    before = await asyncio.to_thread(pull_counters, metrics, fallbacks)
    load = await steady_load(stack, plan, seed=5)
    stack.signal("executor-0", signal.SIGSTOP)
    try:
        pulled_s, cached = await asyncio.to_thread(
            first_token_s, destination, "chaos-follow-up", [*context, 5, 6, 7]
        )
    finally:
        stack.signal("executor-0", signal.SIGCONT)
    after = await asyncio.to_thread(pull_counters, metrics, fallbacks)
    await asyncio.sleep(plan.after_s)
    result = await settle(load, url)
    # The follow-up tried the frozen source, gave up and computed the prefix.
    result["pull_fallbacks"] = after[fallbacks[0]] - before[fallbacks[0]]
    result["follow_up_completed"] = 1
    result["follow_up_cached_tokens"] = cached
    result["follow_up_s"] = round(pulled_s, 2)
    return result


FAULTS: dict[str, Callable[[Stack, Plan], Awaitable[dict[str, Any]]]] = {
    "kill_executor": fault_kill_executor,
    "kill_memory_manager": fault_kill_memory_manager,
    "restart_redis": fault_restart_redis,
    "rolling_update": fault_rolling_update,
    "stop_pull_source": fault_stop_pull_source,
}
