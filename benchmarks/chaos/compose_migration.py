"""`make chaos-compose`'s migration faults: executors lost mid-stream across containers.

The continuity load of benchmarks.chaos.migration (deterministic requests, each checked
against the same request sent alone) runs against the compose router while
- migrate_kill: `docker kill` executor-1, then `docker start` it;
- migrate_pause: `docker pause` executor-1 until the router's stall watch has given up on it
  (`--executor-stall-s`, 10 s, and two more), then `docker unpause` it;
- rolling_restart: `docker restart` every executor in turn (SIGTERM: it drains, hands back
  what outlives its grace period, exits and starts again), each routable before the next.
  With the deployment's grace period (300 s) its streams finish where they run: none
  migrates, and what shows the restart hit streams is `struck_mid_stream`.
Each signal comes once the victim runs sequences (the router's view of it, at most 10 s
later); `struck_mid_stream` says, per signal, whether it did. Which requests migrated comes
from the router container's log.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from benchmarks.chaos.cluster import blocks_leaked, until_serving, wait_healthy
from benchmarks.chaos.containers import EXECUTORS, container, run
from benchmarks.chaos.migration import count_migrations, report, strike_under_load
from benchmarks.chaos.stack import Plan

VICTIM = "executor-1"
STALL_S = 10.0  # the router's --executor-stall-s in the compose stack (its default)
STOP_GRACE_S = 330  # compose's stop_grace_period of the executors


async def back(admin_url: str) -> None:
    await wait_healthy(admin_url, len(EXECUTORS), 300.0)


def router_migrations(since: str) -> dict[str, int]:
    """request id -> continued streams, from the router container's log since `since`."""
    done = subprocess.run(
        ["docker", "logs", "--since", since, container("router")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return count_migrations((done.stdout + done.stderr).splitlines())


def kill(admin_url: str, struck: list[bool]) -> Callable[[], Awaitable[None]]:
    async def strike() -> None:
        cid = container(VICTIM)
        struck.append(await until_serving(admin_url, VICTIM))
        await asyncio.to_thread(run, "docker", "kill", cid)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(run, "docker", "start", cid)
        await back(admin_url)

    return strike


def pause(admin_url: str, struck: list[bool]) -> Callable[[], Awaitable[None]]:
    async def strike() -> None:
        cid = container(VICTIM)
        struck.append(await until_serving(admin_url, VICTIM))
        await asyncio.to_thread(run, "docker", "pause", cid)
        try:
            await asyncio.sleep(STALL_S + 2.0)
        finally:
            await asyncio.to_thread(run, "docker", "unpause", cid)
        await back(admin_url)

    return strike


def rolling_restart(admin_url: str, struck: list[bool]) -> Callable[[], Awaitable[None]]:
    async def strike() -> None:
        for name in EXECUTORS:
            cid = container(name)
            struck.append(await until_serving(admin_url, name))
            restart = ("docker", "restart", "-t", str(STOP_GRACE_S), cid)
            await asyncio.to_thread(run, *restart, timeout=STOP_GRACE_S + 60)
            await back(admin_url)

    return strike


STRIKES: dict[str, tuple[Callable[[str, list[bool]], Callable[[], Awaitable[None]]], int]] = {
    "migrate_kill": (kill, 2),  # (the strike, how many times it strikes)
    "migrate_pause": (pause, 2),
    "rolling_restart": (rolling_restart, 1),
}


async def migration_fault(
    name: str, url: str, admin_url: str, concurrency: int, model: str, seed: int
) -> dict[str, Any]:
    """One fault of `STRIKES` against the compose stack; `benchmarks.chaos.migration`'s
    figures."""
    make_strike, rounds = STRIKES[name]
    plan = Plan(concurrency=concurrency, before_s=4.0, after_s=8.0, fault_rounds=rounds)
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    struck: list[bool] = []  # per signal: whether the victim ran sequences when it came
    strike = make_strike(admin_url, struck)
    checked, refs, seconds = await strike_under_load(url, plan, strike, seed, model)
    result = report(checked, refs, await asyncio.to_thread(router_migrations, since))
    result["rounds"] = rounds
    result["struck_mid_stream"] = struck
    # A restart drains with the deployment's grace period (--drain-timeout-s, 300 s): its
    # streams finish where they run, and none needs to migrate.
    result["drains_within_grace"] = name == "rolling_restart"
    result["fault_to_healthy_s"] = seconds
    result["blocks_leaked"] = await blocks_leaked(admin_url, timeout_s=60)
    return result
