"""The stack under pressure rather than a fault: a leak soak on small KV pools, and overload."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from typing import Any

import httpx

from benchmarks.chaos.cluster import (
    blocks_leaked,
    executor_record,
    manager_pools,
    peak_rss_kib,
    router_durations_ms,
)
from benchmarks.chaos.load import Load, Outcome, one_request, stream_body, tally
from benchmarks.chaos.stack import Plan, settle
from benchmarks.common.stats import percentile
from services.stack.runner import Stack


async def soak(stack: Stack, plan: Plan) -> dict[str, Any]:
    """Many mixed requests on small KV pools (preemptions), then every pool must be empty."""
    url = stack.config.router_url
    load = Load(
        [url], concurrency=max(plan.concurrency, 8), max_tokens=48, disconnect_rate=0.2, seed=5
    )
    load.start()
    while len(load.outcomes) < plan.soak_requests:
        await asyncio.sleep(0.2)
    result = await settle(load, stack.config.router_admin_url)
    pools = await asyncio.to_thread(manager_pools, stack, ["executor-0", "executor-1"])
    result["pools"] = pools
    result["preemptions"] = sum(p["preemptions"] for p in pools.values())
    # a dead executor's record leaves Redis once its liveness TTL passed
    stack.signal("executor-1", signal.SIGKILL)
    await asyncio.sleep(3.0)
    result["dead_executor_record_gone"] = executor_record(stack, "executor-1") is None
    return result


async def overload(stack: Stack, plan: Plan) -> dict[str, Any]:
    """Open-loop arrivals at ~10x the sustainable rate; admitted TTFT vs unloaded, 429 speed.

    The sustainable rate is what `max_pending_total` closed-loop clients complete per second;
    then requests arrive (Poisson) at ten times that rate for `plan.overload_s`.
    """
    url = stack.config.router_url
    bound = stack.config.max_pending_total
    unloaded: list[float] = []
    # A connection pool that never makes a request wait: only the router's latency counts.
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        for i in range(plan.unloaded_samples):
            o = await one_request(client, url, {"kind": "stream", "body": stream_body(i)}, 30.0)
            if o.ttft is not None:
                unloaded.append(o.ttft)
        peaks_before = peak_rss_kib(stack)
        steady = Load([url], concurrency=bound, disconnect_rate=0.0, seed=6)
        steady.pick = lambda: {"kind": "stream", "body": stream_body(random.randrange(1 << 20))}  # type: ignore[method-assign]
        t0 = time.monotonic()
        steady.start()
        await asyncio.sleep(plan.overload_s / 2)
        await steady.finish()
        sustainable = sum(o.bucket == "completed" for o in steady.outcomes) / (
            time.monotonic() - t0
        )
        at_bound = [o.ttft for o in steady.outcomes if o.bucket == "completed" and o.ttft]
        rate = 10 * sustainable
        rng = random.Random(7)
        tasks: list[asyncio.Task[Outcome]] = []
        t_end = time.monotonic() + plan.overload_s
        log_offset = stack.log_path("router").stat().st_size
        while time.monotonic() < t_end:
            body = {"kind": "stream", "body": stream_body(rng.randrange(1 << 20))}
            tasks.append(asyncio.create_task(one_request(client, url, body, 30.0)))
            await asyncio.sleep(rng.expovariate(rate))
        outcomes = list(await asyncio.gather(*tasks))
    admitted = [o.ttft for o in outcomes if o.bucket == "completed" and o.ttft is not None]
    rejected = [o.end - o.start for o in outcomes if o.status == 429]
    served_429 = router_durations_ms(stack, log_offset, 429)
    result: dict[str, Any] = tally(outcomes)
    result["blocks_leaked"] = await blocks_leaked(stack.config.router_admin_url)
    result["admission_bound"] = bound
    result["sustainable_rps"] = round(sustainable, 2)
    result["offered_rps"] = round(rate, 2)
    result["rejected_429"] = len(rejected)
    result["ttft_unloaded_p50_s"] = round(percentile(unloaded, 0.5), 4)
    result["ttft_unloaded_p99_s"] = round(percentile(unloaded, 0.99), 4)
    result["ttft_at_bound_p50_s"] = round(percentile(at_bound, 0.5), 4)
    result["ttft_at_bound_p99_s"] = round(percentile(at_bound, 0.99), 4)
    result["ttft_admitted_p50_s"] = round(percentile(admitted, 0.5), 4)
    result["ttft_admitted_p99_s"] = round(percentile(admitted, 0.99), 4)
    result["ttft_p99_ratio"] = round(
        percentile(admitted, 0.99) / max(percentile(unloaded, 0.99), 1e-9), 2
    )
    # Against the latency at the admission bound without overload: what overload itself costs.
    result["ttft_p99_ratio_vs_at_bound"] = round(
        percentile(admitted, 0.99) / max(percentile(at_bound, 0.99), 1e-9), 2
    )
    result["reject_429_client_p50_ms"] = round(percentile(rejected, 0.5) * 1000, 1)
    result["reject_429_client_p99_ms"] = round(percentile(rejected, 0.99) * 1000, 1)
    result["reject_429_router_p50_ms"] = round(percentile(served_429, 0.5), 1)
    result["reject_429_router_p99_ms"] = round(percentile(served_429, 0.99), 1)
    result["peak_rss_kib_unloaded"] = peaks_before
    result["peak_rss_kib"] = peak_rss_kib(stack)
    return result
