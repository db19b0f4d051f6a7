"""A rolling restart of every executor under Locust load: `make rolling-restart`.

A local stack (Redis, memory manager, `--executors` executors, router; the tiny model) takes
Locust's load (loadtests/locustfile.py: streaming chat and completions with ShareGPT prompts,
`ignore_eos`, so a stream short of its max_tokens fails) while each executor in turn gets
SIGTERM, drains (new requests go elsewhere; what outlives its --drain-timeout-s is handed back
and the router continues it on another executor), exits, is started again and serves before
the next one goes. Writes bench/results/rolling-restart.json: Locust's request and failure
counts, each restart's drain and start times, the exit codes and the router's migrations;
exit status 1 on any failed request or an executor that did not exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.chaos.cluster import wait_healthy
from benchmarks.chaos.migration import executor_env, migrations_by_request
from benchmarks.chaos.stack import REPO, make_config, start_process, with_stack
from benchmarks.common.report import write_json
from services.stack.runner import Stack

RESULTS = REPO / "bench" / "results" / "rolling-restart.json"
LOCUST = Path(sys.executable).with_name("locust")
# The workload's lengths kept small for the tiny model on a few cores; ShareGPT prompts.
LOAD_ENV = {
    "QUIRE_LOAD_MAX_PROMPT_TOKENS": "256",
    "QUIRE_LOAD_MAX_TOKENS": "128",
    "QUIRE_LOAD_SYSTEM_TOKENS": "128",
    "QUIRE_LOAD_NUM_TENANTS": "2",
    "QUIRE_LOAD_THINK_S": "0.2",
    "QUIRE_LOAD_TOKENIZER": str(REPO / "models" / "quire-tiny"),
    "QUIRE_LOAD_POOL_SIZE": "200",
}
RESTART_BUDGET_S = 40.0  # the load's length allows this much per executor restart


async def restart(stack: Stack, name: str) -> dict[str, Any]:
    """SIGTERM one executor, wait for its exit, start it again and wait until it serves."""
    t0 = time.monotonic()
    stack.signal(name, signal.SIGTERM)
    code = await asyncio.to_thread(stack.procs[name].wait, 600)
    t_exit = time.monotonic()
    await start_process(stack, name, 120.0)
    await wait_healthy(stack.config.router_admin_url, stack.config.num_executors, 120.0)
    return {
        "executor": name,
        "exit_code": code,
        "drain_s": round(t_exit - t0, 2),
        "back_s": round(time.monotonic() - t_exit, 2),
    }


async def wait_for_requests(
    log_path: Path, offset: int, count: int, locust: subprocess.Popen[bytes]
) -> None:
    """Until the router has logged `count` requests past `offset` (Locust is sending)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if locust.poll() is not None:
            raise RuntimeError(f"locust exited {locust.returncode} before sending")
        with log_path.open("rb") as f:
            f.seek(offset)
            if sum(b'"event": "request"' in line for line in f) >= count:
                return
        await asyncio.sleep(0.5)
    raise RuntimeError("locust sent nothing in 300 s")


def locust_counts(prefix: Path) -> dict[str, Any]:
    """Requests and failures from Locust's CSV, with a few failure messages."""
    with prefix.with_name(prefix.name + "_stats.csv").open() as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    total = rows[("", "Aggregated")]
    by_endpoint = {
        name: int(row["Request Count"]) for (kind, name), row in rows.items() if kind == "POST"
    }
    counts: dict[str, Any] = {
        "requests": sum(by_endpoint.values()),
        "failed": int(total["Failure Count"]),  # requests and stream checks (TTFT, ITL) alike
        "by_endpoint": by_endpoint,
    }
    failures = prefix.with_name(prefix.name + "_failures.csv")
    if counts["failed"] and failures.exists():
        with failures.open() as f:
            counts["failures"] = [f"{r['Name']}: {r['Error']}"[:300] for r in csv.DictReader(f)][:5]
    return counts


async def rolling_restart(stack: Stack, users: int, before_s: float, out: Path) -> dict[str, Any]:
    """Locust against the stack while every executor restarts in turn; the figures."""
    names = [f"executor-{i}" for i in range(stack.config.num_executors)]
    run_s = round(before_s * 2 + RESTART_BUDGET_S * len(names))  # from its first request
    prefix = out.parent / "rolling-restart-locust"
    argv = [str(LOCUST), "-f", "loadtests/locustfile.py", "--headless", "-u", str(users)]
    argv += ["-r", str(users), "-t", f"{run_s}s", "--stop-timeout", "120", "--only-summary"]
    argv += ["--host", stack.config.router_url, "--csv", str(prefix)]
    log_path = stack.log_path("router")
    offset = log_path.stat().st_size
    locust_log = (stack.run_dir / "locust.log").open("wb")
    locust = subprocess.Popen(
        argv, cwd=REPO, env={**os.environ, **LOAD_ENV}, stdout=locust_log, stderr=locust_log
    )
    try:
        # Locust reads and tokenizes its ShareGPT pool first: the load starts once it sends.
        await wait_for_requests(log_path, offset, users, locust)
        t_start = time.monotonic()
        await asyncio.sleep(before_s)
        restarts = [await restart(stack, name) for name in names]
        restarts_done_s = time.monotonic() - t_start
        code = await asyncio.to_thread(locust.wait, run_s + 600)
    finally:
        if locust.poll() is None:
            locust.kill()
        locust_log.close()
    migrated = migrations_by_request(log_path, offset)
    return {
        "users": users,
        "load_s": run_s,
        "restarts_done_s": round(restarts_done_s, 1),
        "restarts_under_load": restarts_done_s < run_s,
        "locust_exit_code": code,
        **locust_counts(prefix),
        "restarts": restarts,
        "migrated_requests": len(migrated),
        "migrations": sum(migrated.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos.rolling", description=__doc__)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--users", type=int, default=8, help="Locust users")
    parser.add_argument("--before-s", type=float, default=10.0, help="load before and after")
    parser.add_argument(
        "--drain-timeout-s",
        type=float,
        default=None,
        help="the executors' grace period (default: theirs, --drain-timeout-s)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=REPO / ".run" / "rolling-restart")
    args = parser.parse_args(argv)
    env = (
        {} if args.drain_timeout_s is None else {"QUIRE_DRAIN_TIMEOUT_S": str(args.drain_timeout_s)}
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with executor_env(**env):
        result = asyncio.run(
            with_stack(
                make_config(num_executors=args.executors),
                args.work_dir,
                lambda s: rolling_restart(s, args.users, args.before_s, args.out),
            )
        )
    result["drain_timeout_s"] = args.drain_timeout_s
    write_json(args.out, result)
    bad = result["failed"] or any(r["exit_code"] != 0 for r in result["restarts"])
    print(
        f"wrote {args.out}: {result['requests']} requests, {result['failed']} failed, "
        f"{result['migrated_requests']} migrated" + ("; FAILED" if bad else "")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
