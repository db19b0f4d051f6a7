"""Faults across containers against the running compose stack: `make chaos-compose`.

`make chaos` kills local processes; this does the same to the containers of `make compose-up`
(docker-compose project "quire"), under the same closed-loop load, classified into the same
buckets (completed, failed_clean, hung, lost, disconnected; see benchmarks/chaos/):

- kill_executor: `docker kill` executor-1, then `docker start` it
- restart_memory_manager: `docker restart` the memory manager's container
- pause_redis: `docker pause` Redis for `--pause-s` (10 s), then unpause
- disconnect_executor: `docker network disconnect` executor-1, `--cut-s` later reconnect it
- migrate_kill, migrate_pause, rolling_restart: executors lost mid-stream (`docker kill`,
  `docker pause`, `docker restart` of each in turn) under a load whose every request is
  checked token for token (benchmarks/chaos/compose_migration.py)

For each: every request ends completed or with a clear error (none hung or lost), no KV block
is left in use at the executors or the memory manager once idle, and routing leaves the
faulty executor within 2 s (`routed_to_dead_after_2s`) and comes back after it returns
(`back_s`: until it completes a request again; a run where it never does fails). Writes bench/results/chaos-compose.json in `make chaos`'s
shape; exit status 1 on any hung, lost or leaked block, or a routing check that failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.chaos import compose_migration
from benchmarks.chaos.cli import failures
from benchmarks.chaos.cluster import blocks_leaked, cluster_status
from benchmarks.chaos.containers import EXECUTORS, NETWORK, container, manager_pools, run
from benchmarks.chaos.load import Load, one_request, served_by, tally
from benchmarks.chaos.stack import REPO
from benchmarks.common.report import write_json

RESULTS = REPO / "bench" / "results" / "chaos-compose.json"
MODEL = "smollm2-135m-instruct"
VICTIM = "executor-1"


class ComposeLoad(Load):
    """`make chaos`'s load, asking for the compose stack's model."""

    def pick(self) -> dict[str, Any]:
        req = super().pick()
        req["body"]["model"] = MODEL
        return req


@dataclass(frozen=True)
class Router:
    """Where the compose stack's router is reached: the API, and the admin port that answers
    /cluster/status."""

    url: str
    admin_url: str


@dataclass
class Plan:
    concurrency: int = 3
    max_tokens: int = 16
    before_s: float = 4.0  # load before the fault
    after_s: float = 8.0  # load after the service is back
    pause_s: float = 10.0  # docker pause of Redis
    cut_s: float = 8.0  # how long executor-1 stays off the network
    deadline_s: float = 60.0  # a request still open this long is hung


async def wait_routable(router: Router, executor_id: str, timeout_s: float = 120.0) -> float:
    """Seconds until the router lists `executor_id` healthy again."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if any(
                e["id"] == executor_id and e["healthy"]
                for e in await cluster_status(router.admin_url)
            ):
                return time.monotonic() - start
        except Exception:  # the router's status may fail while Redis is away
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{executor_id} not routable {timeout_s} s after it came back")


async def served_again(router: Router, executor_id: str, timeout_s: float = 90.0) -> float:
    """Seconds until `executor_id` completes a request again. Fresh prompts (no cached prefix
    pins them to the other executor), four at a time, so the router's load balancing decides."""
    start = time.monotonic()
    n = 0
    async with httpx.AsyncClient(timeout=30) as client:
        while time.monotonic() - start < timeout_s:
            bodies = []
            for _ in range(4):
                n += 1
                prompt = f"Probe {n} {time.time_ns()}: name a colour and a number"
                body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0}
                bodies.append({"kind": "plain", "body": body})
            outcomes = await asyncio.gather(
                *(one_request(client, router.url, b, 30) for b in bodies)
            )
            if any(o.bucket == "completed" and o.executors == executor_id for o in outcomes):
                return time.monotonic() - start
    raise RuntimeError(f"{executor_id} served nothing {timeout_s} s after it came back")


async def steady_load(router: Router, plan: Plan, seed: int) -> ComposeLoad:
    """The closed-loop load, started and left to run `plan.before_s`: what a fault interrupts."""
    load = ComposeLoad([router.url], plan.concurrency, plan.max_tokens, plan.deadline_s, seed=seed)
    load.start()
    await asyncio.sleep(plan.before_s)
    return load


async def comes_back(router: Router, since: float, plan: Plan) -> tuple[float, float, float]:
    """Seconds until the victim, back at `since`, is routable and until it serves again; then
    `plan.after_s` more of the load. Returns those seconds and when it served again."""
    routable_s = await wait_routable(router, VICTIM)
    back_s = time.monotonic() - since + await served_again(router, VICTIM)
    t_back = time.monotonic()
    await asyncio.sleep(plan.after_s)
    return routable_s, back_s, t_back


async def finish(load: Load, router: Router, result: dict[str, Any]) -> dict[str, Any]:
    """Stop the load; its buckets, `result`, and the KV blocks left in use at the executors
    and the memory manager once idle."""
    await load.finish()
    out = {**tally(load.outcomes), **result}
    out["blocks_leaked"] = await blocks_leaked(router.admin_url, timeout_s=60)
    pools = await asyncio.to_thread(manager_pools)
    out["manager_blocks_used"] = sum(p["used"] for p in pools.values())
    out["manager_pools_consistent"] = all(p["consistent"] for p in pools.values())
    # GetBlockStates answers only for registered executors: after a manager restart, this
    # says both re-registered.
    out["manager_knows"] = sorted(pools)
    out["blocks_leaked"] += out["manager_blocks_used"]
    return out


async def fault_kill_executor(router: Router, plan: Plan) -> dict[str, Any]:
    """`docker kill` executor-1 mid-load, `docker start` it, check it serves again."""
    cid = container(VICTIM)
    load = await steady_load(router, plan, seed=1)
    t_fault = time.monotonic()
    await asyncio.to_thread(run, "docker", "kill", cid)
    await asyncio.sleep(3.0)
    late = served_by(load.outcomes_since(t_fault + 2.0), VICTIM)
    t_start = time.monotonic()
    await asyncio.to_thread(run, "docker", "start", cid)
    routable_s, back_s, t_back = await comes_back(router, t_start, plan)
    return await finish(
        load,
        router,
        {
            "routed_to_dead_after_2s": len(late),
            "restart_to_routable_s": round(routable_s, 2),
            "back_s": round(back_s, 2),  # docker start -> it completes a request again
            "served_after_restart": len(served_by(load.outcomes_since(t_back), VICTIM)),
        },
    )


async def fault_restart_memory_manager(router: Router, plan: Plan) -> dict[str, Any]:
    """`docker restart` the memory manager mid-load."""
    cid = container("memory-manager")
    load = await steady_load(router, plan, seed=2)
    t_fault = time.monotonic()
    await asyncio.to_thread(run, "docker", "restart", "-t", "10", cid)
    t_back = time.monotonic()
    await asyncio.sleep(plan.after_s)
    late = load.outcomes_since(t_back)
    return await finish(
        load,
        router,
        {
            "restart_s": round(t_back - t_fault, 2),
            "completed_after_restart": sum(o.bucket == "completed" for o in late),
        },
    )


async def fault_pause_redis(router: Router, plan: Plan) -> dict[str, Any]:
    """`docker pause` Redis for `plan.pause_s`, then unpause it."""
    cid = container("redis")
    load = await steady_load(router, plan, seed=3)
    t_pause = time.monotonic()
    await asyncio.to_thread(run, "docker", "pause", cid)
    try:
        await asyncio.sleep(plan.pause_s)
    finally:
        await asyncio.to_thread(run, "docker", "unpause", cid)
    t_back = time.monotonic()
    await asyncio.sleep(plan.after_s)
    during = [o for o in load.outcomes_since(t_pause) if o.start < t_back]
    return await finish(
        load,
        router,
        {
            "paused_s": round(t_back - t_pause, 2),
            "completed_during_pause": sum(o.bucket == "completed" for o in during),
            "executors_routable_after": sorted(
                e["id"] for e in await cluster_status(router.admin_url) if e["healthy"]
            ),
        },
    )


async def fault_disconnect_executor(router: Router, plan: Plan) -> dict[str, Any]:
    """Cut executor-1 off the network for `plan.cut_s`, then reconnect it."""
    cid = container(VICTIM)
    load = await steady_load(router, plan, seed=4)
    t_cut = time.monotonic()
    await asyncio.to_thread(run, "docker", "network", "disconnect", NETWORK, cid)
    try:
        await asyncio.sleep(plan.cut_s)
        late = served_by(load.outcomes_since(t_cut + 2.0), VICTIM)
    finally:
        # The service name is the alias the others dial (executor-1:50062).
        await asyncio.to_thread(
            run, "docker", "network", "connect", "--alias", VICTIM, NETWORK, cid
        )
    t_reconnect = time.monotonic()
    routable_s, back_s, t_back = await comes_back(router, t_reconnect, plan)
    return await finish(
        load,
        router,
        {
            "routed_to_dead_after_2s": len(late),
            "cut_s": round(t_reconnect - t_cut, 2),
            "reconnect_to_routable_s": round(routable_s, 2),
            "back_s": round(back_s, 2),  # reconnect -> it completes a request again
            "served_after_restart": len(served_by(load.outcomes_since(t_back), VICTIM)),
        },
    )


async def complete_once(router: Router, prompt: str) -> tuple[str, int, float]:
    """One greedy one-token completion: who served it, its cached prompt tokens, seconds."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(f"{router.url}/v1/completions", json=body)
    response.raise_for_status()
    cached = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return response.headers["x-quire-executor"], cached, time.monotonic() - started


async def fault_pause_pull_source(router: Router, plan: Plan) -> dict[str, Any]:
    """`docker pause` the executor holding a long context, then send its follow-up: another
    executor is offered the paused one's blocks, its pull times out and it computes them."""
    context = " ".join(f"Fact {i}: the sky over harbour {i} is clear today." for i in range(40))
    source, _, _ = await complete_once(router, context)
    cid = container(source)
    load = await steady_load(router, plan, seed=5)
    await asyncio.to_thread(run, "docker", "pause", cid)
    try:
        await asyncio.sleep(3.0)  # past the liveness TTL: the router stops choosing it
        served, cached, seconds = await complete_once(router, context + " And the sea?")
    finally:
        await asyncio.to_thread(run, "docker", "unpause", cid)
    t_unpause = time.monotonic()
    routable_s = await wait_routable(router, source)
    await asyncio.sleep(plan.after_s)
    return await finish(
        load,
        router,
        {
            "source": source,
            "follow_up_served_by": served,
            "follow_up_cached_tokens": cached,
            "follow_up_s": round(seconds, 2),  # includes the pull's timeout
            "unpause_to_routable_s": round(routable_s, 2),
            "completed_after_unpause": sum(
                o.bucket == "completed" for o in load.outcomes_since(t_unpause)
            ),
        },
    )


def migration_fault(name: str, seed: int) -> Callable[[Router, Plan], Awaitable[dict[str, Any]]]:
    """One of benchmarks.chaos.compose_migration's faults, as a fault of this list."""

    async def fault(router: Router, plan: Plan) -> dict[str, Any]:
        return await compose_migration.migration_fault(
            name, router.url, router.admin_url, plan.concurrency, MODEL, seed
        )

    return fault


FAULTS: dict[str, Callable[[Router, Plan], Awaitable[dict[str, Any]]]] = {
    "kill_executor": fault_kill_executor,
    "restart_memory_manager": fault_restart_memory_manager,
    "pause_redis": fault_pause_redis,
    "disconnect_executor": fault_disconnect_executor,
    "pause_pull_source": fault_pause_pull_source,
    **{
        name: migration_fault(name, seed)
        for seed, name in enumerate(compose_migration.STRIKES, start=10)
    },
}


def routing_failures(results: dict[str, Any]) -> list[str]:
    """Routing that stayed on a dead executor, or never came back to it."""
    bad = []
    for name, r in results["faults"].items():
        if r.get("routed_to_dead_after_2s", 0):
            bad.append(f"{name}: routed_to_dead_after_2s={r['routed_to_dead_after_2s']}")
        if r.get("completed", 0) == 0:
            bad.append(f"{name}: nothing completed")
        if r.get("manager_pools_consistent") is False:
            bad.append(f"{name}: the memory manager's block states disagree with its counters")
    return bad


async def run_all(router: Router, plan: Plan, only: list[str] | None) -> dict[str, Any]:
    """Every fault (`only` picks some), each starting on a whole cluster."""
    results: dict[str, Any] = {"faults": {}}
    for eid in EXECUTORS:  # up and serving (a stack just recreated may list stale records)
        await wait_routable(router, eid, timeout_s=300.0)
        await served_again(router, eid, timeout_s=300.0)
    for name, fault in FAULTS.items():
        if only and name not in only:
            continue
        print(f"fault {name} ...", flush=True)
        t0 = time.monotonic()
        results["faults"][name] = await fault(router, plan)
        results["faults"][name]["scenario_s"] = round(time.monotonic() - t0, 1)
        print(json.dumps(results["faults"][name]), flush=True)
        for eid in EXECUTORS:  # the next fault starts on a whole cluster
            await wait_routable(router, eid)
    return results


def main(argv: list[str] | None = None) -> int:
    """Run `make chaos-compose`, write its JSON; exit status 1 on any failed check."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos_compose",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the compose router")
    parser.add_argument(
        "--admin-url", default="http://127.0.0.1:8001", help="the compose router's admin port"
    )
    parser.add_argument("--only", nargs="*", choices=list(FAULTS), help="run only these faults")
    parser.add_argument("--concurrency", type=int, default=Plan.concurrency)
    parser.add_argument("--pause-s", type=float, default=Plan.pause_s)
    parser.add_argument("--cut-s", type=float, default=Plan.cut_s)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    plan = Plan(concurrency=args.concurrency, pause_s=args.pause_s, cut_s=args.cut_s)
    results = asyncio.run(run_all(Router(args.url, args.admin_url), plan, args.only))
    write_json(args.out, results)
    bad = failures(results) + routing_failures(results)
    print(f"wrote {args.out}" + (f"; FAILED: {', '.join(bad)}" if bad else "; all faults clean"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
