"""Fault injection, a leak soak and overload against a real stack: `make chaos`.

Every scenario starts its own stack (Redis, memory manager, executors, router) on free
ports, drives steady load with async HTTP clients (streaming and not, n>1, stop strings,
client disconnects) and injects one fault. Each request ends in exactly one bucket:

- completed: 200 and the whole response (a stream up to ``[DONE]`` without an error event)
- failed_clean: a clear error: an error status with an OpenAI error object (429/503 with
  Retry-After), or an SSE error event
- hung: neither within the deadline
- lost: accepted (200 headers) but the stream ended without ``[DONE]`` and without an error
  event, or a non-streaming response whose connection dropped
- disconnected: the client went away on purpose (an abort), not a failure

`blocks_leaked` is the sum of kv_blocks_used over live executors once the cluster is idle.
The results go to bench/results/chaos.json; the exit status is 1 unless hung, lost and
blocks_leaked are 0 for every fault. `--quick` runs the same scenarios with small counts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import redis

from quire.cluster.registry import ExecutorRecord, executor_key, prefix_key
from services.rpc import memory_manager_pb2, memory_manager_pb2_grpc
from services.stack.ports import free_port, stack_ports
from services.stack.runner import Stack
from services.stack.spec import StackConfig

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "chaos.json"
BUCKETS = ("completed", "failed_clean", "hung", "lost", "disconnected")
PROMPTS = [
    "The quick brown fox jumps over the lazy dog and then",
    "Once upon a time in a land far away there lived a",
    "In the beginning the universe was created. This has made a lot of people",
    "A shared system prompt that many requests begin with, followed by question number",
]


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
    """A second router replica: the first one's command on another port; its URL."""
    first = stack.specs["router"]
    port = free_port()
    argv = list(first.argv)
    argv[argv.index("--port") + 1] = str(port)
    url = f"http://{stack.config.host}:{port}"
    stack.specs[name] = dataclasses.replace(
        first, name=name, argv=argv, ready=("http", f"{url}/health")
    )
    return url


# --- load ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One request's fate."""

    kind: str
    bucket: str
    start: float  # monotonic
    end: float
    status: int = 0
    executors: str = ""  # x-quire-executor
    ttft: float | None = None  # first content event (streams)
    detail: str = ""


ACTIVE: set[Load] = set()  # loads still running (cancelled when their scenario fails)


@dataclass(eq=False)
class Load:
    """Steady closed-loop load: `concurrency` clients, each sending requests back to back."""

    urls: list[str]
    concurrency: int = 6
    max_tokens: int = 24
    deadline_s: float = 30.0
    disconnect_rate: float = 0.1
    seed: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        ACTIVE.add(self)
        self.stop.clear()
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(self.concurrency)]

    async def finish(self) -> None:
        self.stop.set()
        ACTIVE.discard(self)
        await asyncio.gather(*self._tasks)

    def cancel(self) -> None:
        self.stop.set()
        ACTIVE.discard(self)
        for task in self._tasks:
            task.cancel()

    async def _client(self, i: int) -> None:
        limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)
        async with httpx.AsyncClient(timeout=self.deadline_s, limits=limits) as client:
            n = 0
            while not self.stop.is_set():
                urls = self.urls  # the live replicas (a load balancer's list)
                url = urls[(i + n) % len(urls)]
                n += 1
                outcome = await one_request(client, url, self.pick(), self.deadline_s)
                self.outcomes.append(outcome)
                if outcome.detail.startswith("refused"):
                    await asyncio.sleep(0.05)  # no busy loop against a closed port

    def pick(self) -> dict[str, Any]:
        r = self.rng.random()
        body: dict[str, Any] = {
            "model": "quire-tiny",
            "prompt": f"{self.rng.choice(PROMPTS)} {self.rng.randrange(1000)}",
            "max_tokens": self.rng.randint(self.max_tokens // 2, self.max_tokens),
            "temperature": 0.8,
            "seed": self.rng.randrange(1 << 30),
        }
        kind = "stream"
        if r < 0.3:
            kind = "plain"
        elif r < 0.45:
            body["n"] = 2
            kind = "stream-n2"
        elif r < 0.6:
            body["stop"] = ["e", "\n"]
            kind = "stream-stop"
        if kind != "plain":
            body["stream"] = True
            if self.rng.random() < self.disconnect_rate:
                kind = "disconnect"
        return {"kind": kind, "body": body}

    def outcomes_since(self, t: float) -> list[Outcome]:
        return [o for o in self.outcomes if o.start >= t]


def has_error_object(text: str) -> bool:
    with contextlib.suppress(ValueError):
        data = json.loads(text)
        return isinstance(data, dict) and isinstance(data.get("error"), dict)
    return False


async def one_request(
    client: httpx.AsyncClient, url: str, req: dict[str, Any], deadline_s: float
) -> Outcome:
    """Send one request and classify it."""
    out = Outcome(req["kind"], "hung", time.monotonic(), 0.0)
    try:
        await asyncio.wait_for(_send(client, url, req, out), deadline_s)
    except TimeoutError:
        out.bucket = "hung"
    out.end = time.monotonic()
    return out


async def _send(client: httpx.AsyncClient, url: str, req: dict[str, Any], out: Outcome) -> None:
    body = req["body"]
    endpoint = f"{url}/v1/completions"
    if not body.get("stream"):
        try:
            resp = await client.post(endpoint, json=body)
        except httpx.ConnectError as exc:
            out.bucket, out.detail = "failed_clean", f"refused: {exc!r}"  # never accepted
            return
        except httpx.TransportError as exc:
            out.bucket, out.detail = "lost", repr(exc)
            return
        out.status = resp.status_code
        out.executors = resp.headers.get("x-quire-executor", "")
        if resp.status_code == 200:
            choices = resp.json().get("choices", [])
            out.bucket = "completed" if choices else "lost"
        else:
            out.bucket, out.detail = classify_error(resp.status_code, resp.headers, resp.text)
        return
    accepted = False
    try:
        async with client.stream("POST", endpoint, json=body) as resp:
            out.status = resp.status_code
            out.executors = resp.headers.get("x-quire-executor", "")
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                out.bucket, out.detail = classify_error(resp.status_code, resp.headers, text)
                return
            accepted = True
            events = 0
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    if out.bucket != "failed_clean":
                        out.bucket = "completed"
                    return
                if has_error_object(data):
                    out.bucket, out.detail = "failed_clean", data[:200]
                    continue
                events += 1
                if out.ttft is None:
                    out.ttft = time.monotonic() - out.start
                if req["kind"] == "disconnect" and events >= 2:
                    out.bucket = "disconnected"
                    return  # leaving the block closes the connection mid-stream
            if out.bucket != "failed_clean":
                out.bucket, out.detail = "lost", "stream ended without [DONE]"
    except httpx.ConnectError as exc:
        out.bucket, out.detail = "failed_clean", f"refused: {exc!r}"
    except httpx.TransportError as exc:
        if out.bucket != "failed_clean":
            out.bucket = "lost" if accepted else "failed_clean"
            out.detail = repr(exc)


def classify_error(status: int, headers: httpx.Headers, text: str) -> tuple[str, str]:
    """An error status is clean with an OpenAI error object, or as a 429/503 with Retry-After.

    Anything else (a bare status, an HTML page) counts as lost.
    """
    clear = has_error_object(text) or (status in (429, 503) and "retry-after" in headers)
    return ("failed_clean" if clear else "lost"), f"{status}: {text[:200]}"


def tally(outcomes: list[Outcome]) -> dict[str, Any]:
    counts = {"sent": len(outcomes), **{b: 0 for b in BUCKETS}}
    examples: list[str] = []
    for o in outcomes:
        counts[o.bucket] += 1
        if o.bucket in ("hung", "lost") and len(examples) < 5:
            examples.append(f"{o.kind} {o.bucket} status={o.status} {o.detail}"[:300])
    return {**counts, "examples": examples} if examples else counts


# --- cluster state ------------------------------------------------------------------------


async def cluster_status(url: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=5) as client:
        executors: list[dict[str, Any]] = (await client.get(f"{url}/cluster/status")).json()[
            "executors"
        ]
        return executors


async def wait_healthy(url: str, n: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    healthy: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            healthy = [e for e in await cluster_status(url) if e["healthy"]]
            if len(healthy) >= n:
                return healthy
        await asyncio.sleep(0.2)
    raise RuntimeError(f"only {len(healthy)} healthy executors after {timeout_s} s")


async def blocks_leaked(url: str, timeout_s: float = 20.0) -> int:
    """kv_blocks_used summed over live executors once idle (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    used = -1
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            live = [e for e in await cluster_status(url) if e["healthy"]]
            used = sum(e["kv_blocks_used"] for e in live)
            if live and used == 0 and all(e["num_running"] == 0 for e in live):
                return 0
        await asyncio.sleep(0.25)
    return used


def redis_client(stack: Stack) -> redis.Redis:
    return redis.Redis(host=stack.config.host, port=stack.config.redis_port, socket_timeout=2)


def executor_record(stack: Stack, executor_id: str) -> ExecutorRecord | None:
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


# --- scenarios ----------------------------------------------------------------------------


@dataclass
class Plan:
    """How long the load runs around a fault."""

    concurrency: int = 6
    before_s: float = 3.0  # steady load before the fault
    after_s: float = 6.0  # load after the fault (and the restart)
    soak_requests: int = 400
    overload_s: float = 10.0
    unloaded_samples: int = 50  # sequential requests whose TTFT p99 is the unloaded reference


QUICK = Plan(
    concurrency=4,
    before_s=1.5,
    after_s=3.0,
    soak_requests=60,
    overload_s=4.0,
    unloaded_samples=12,
)


async def with_stack(
    config: StackConfig, run_dir: Path, body: Callable[[Stack], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    shutil.rmtree(run_dir, ignore_errors=True)  # logs of this run only
    stack = Stack(config, run_dir, cwd=REPO)
    await asyncio.to_thread(stack.start, 120.0)
    try:
        await wait_healthy(config.router_url, config.num_executors)
        return await body(stack)
    finally:
        for load in list(ACTIVE):
            load.cancel()
        await asyncio.to_thread(stack.stop)


def served_by(outcomes: list[Outcome], executor_id: str) -> list[Outcome]:
    return [o for o in outcomes if executor_id in o.executors.split(",")]


async def fault_kill_executor(stack: Stack, plan: Plan) -> dict[str, Any]:
    """SIGKILL an executor mid-stream, check rerouting, restart it, check it serves again."""
    url = stack.config.router_url
    victim = "executor-1"
    epoch_before = executor_record(stack, victim)
    load = Load([url], concurrency=plan.concurrency, seed=1)
    load.start()
    await asyncio.sleep(plan.before_s)
    t_kill = time.monotonic()
    stack.signal(victim, signal.SIGKILL)
    await asyncio.sleep(plan.after_s / 2)
    late = [o for o in served_by(load.outcomes_since(t_kill + 2.0), victim)]
    t_restart = time.monotonic()
    await asyncio.to_thread(stack.start_one, victim)
    await asyncio.to_thread(stack.wait_ready, victim, 60.0)
    await wait_healthy(url, 2)
    t_back = time.monotonic()
    await asyncio.sleep(plan.after_s)
    await load.finish()
    after = executor_record(stack, victim)
    result: dict[str, Any] = tally(load.outcomes)
    result["blocks_leaked"] = await blocks_leaked(url)
    result["routed_to_dead_after_2s"] = len(late)
    result["restart_s"] = round(t_back - t_restart, 2)
    result["new_epoch"] = bool(epoch_before and after and after.epoch != epoch_before.epoch)
    result["served_after_restart"] = len(served_by(load.outcomes_since(t_back), victim))
    return result


async def fault_kill_memory_manager(stack: Stack, plan: Plan) -> dict[str, Any]:
    """SIGKILL the memory manager mid-load and restart it."""
    url = stack.config.router_url
    load = Load([url], concurrency=plan.concurrency, seed=2)
    load.start()
    await asyncio.sleep(plan.before_s)
    stack.signal("memory-manager", signal.SIGKILL)
    await asyncio.sleep(1.0)
    await asyncio.to_thread(stack.start_one, "memory-manager")
    await asyncio.to_thread(stack.wait_ready, "memory-manager", 60.0)
    t_back = time.monotonic()
    await asyncio.sleep(plan.after_s)
    await load.finish()
    result: dict[str, Any] = tally(load.outcomes)
    result["blocks_leaked"] = await blocks_leaked(url)
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
    url = stack.config.router_url
    load = Load([url], concurrency=plan.concurrency, seed=3)
    load.start()
    await asyncio.sleep(plan.before_s)
    stack.signal("redis", signal.SIGKILL)
    await asyncio.sleep(2.0)
    await asyncio.to_thread(stack.start_one, "redis")
    await asyncio.to_thread(stack.wait_ready, "redis", 30.0)
    await asyncio.sleep(plan.after_s)
    await load.finish()
    result: dict[str, Any] = tally(load.outcomes)
    result["blocks_leaked"] = await blocks_leaked(url)
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
    await asyncio.to_thread(stack.start_one, "router-1")
    await asyncio.to_thread(stack.wait_ready, "router-1", 60.0)
    load = Load([url, second], concurrency=plan.concurrency, seed=4)
    load.start()
    await asyncio.sleep(plan.before_s)
    load.urls = [url]  # the load balancer takes the draining replica out of rotation
    stack.signal("router-1", signal.SIGTERM)
    await asyncio.sleep(plan.after_s / 2)
    stack.signal("executor-1", signal.SIGTERM)
    await asyncio.sleep(plan.after_s / 2)
    await load.finish()
    result: dict[str, Any] = tally(load.outcomes)
    result["blocks_leaked"] = await blocks_leaked(url)
    result["router_exit"] = stack.procs["router-1"].wait(15)
    result["executor_exit"] = stack.procs["executor-1"].wait(30)
    return result


FAULTS: dict[str, Callable[[Stack, Plan], Awaitable[dict[str, Any]]]] = {
    "kill_executor": fault_kill_executor,
    "kill_memory_manager": fault_kill_memory_manager,
    "restart_redis": fault_restart_redis,
    "rolling_update": fault_rolling_update,
}


async def soak(stack: Stack, plan: Plan) -> dict[str, Any]:
    """Many mixed requests on small KV pools (preemptions), then every pool must be empty."""
    url = stack.config.router_url
    load = Load(
        [url], concurrency=max(plan.concurrency, 8), max_tokens=48, disconnect_rate=0.2, seed=5
    )
    load.start()
    while len(load.outcomes) < plan.soak_requests:
        await asyncio.sleep(0.2)
    await load.finish()
    result: dict[str, Any] = tally(load.outcomes)
    result["blocks_leaked"] = await blocks_leaked(url)
    pools = await asyncio.to_thread(manager_pools, stack, ["executor-0", "executor-1"])
    result["pools"] = pools
    result["preemptions"] = sum(p["preemptions"] for p in pools.values())
    # a dead executor's record leaves Redis once its liveness TTL passed
    stack.signal("executor-1", signal.SIGKILL)
    await asyncio.sleep(3.0)
    result["dead_executor_record_gone"] = executor_record(stack, "executor-1") is None
    return result


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
    result["blocks_leaked"] = await blocks_leaked(url)
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


def stream_body(seed: int) -> dict[str, Any]:
    return {
        "model": "quire-tiny",
        "prompt": f"{PROMPTS[seed % len(PROMPTS)]} {seed}",
        "max_tokens": 16,
        "stream": True,
        "temperature": 0.0,
    }


# --- runner -------------------------------------------------------------------------------


def failures(results: dict[str, Any]) -> list[str]:
    """Every fault (and the soak) with hung, lost or leaked blocks."""
    bad = []
    for name, r in {**results.get("faults", {}), "soak": results.get("soak", {})}.items():
        for key in ("hung", "lost", "blocks_leaked"):
            if r.get(key, 0) != 0:
                bad.append(f"{name}: {key}={r[key]}")
    return bad


async def run_all(plan: Plan, work_dir: Path, only: list[str] | None = None) -> dict[str, Any]:
    results: dict[str, Any] = {"faults": {}}
    for name, fault in FAULTS.items():
        if only and name not in only:
            continue
        print(f"fault {name} ...", flush=True)
        results["faults"][name] = await with_stack(
            make_config(),
            work_dir / name,
            lambda s, f=fault: f(s, plan),  # type: ignore[misc]
        )
        print(json.dumps(results["faults"][name]), flush=True)
    if not only or "soak" in only:
        print("soak ...", flush=True)
        results["soak"] = await with_stack(
            make_config(num_kv_blocks=24), work_dir / "soak", lambda s: soak(s, plan)
        )
    if not only or "overload" in only:
        print("overload ...", flush=True)
        config = make_config(num_kv_blocks=512, max_pending_per_executor=4, max_pending_total=8)
        results["overload"] = await with_stack(
            config, work_dir / "overload", lambda s: overload(s, plan)
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    parser.add_argument("--only", nargs="*", help="fault names, soak, overload")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=REPO / ".run" / "chaos")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    results = asyncio.run(run_all(plan, args.work_dir, args.only))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    bad = failures(results)
    print(f"wrote {args.out}" + (f"; FAILED: {', '.join(bad)}" if bad else "; all faults clean"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
