"""Executors lost mid-stream under load, and what the router's migrations made of it.

Three faults hit executor-1 while closed-loop clients stream from both executors: `kill`
(SIGKILL), `pause` (SIGSTOP, until the router's stall watch gives up on it, then SIGCONT) and
`drain` (SIGTERM with a short --drain-timeout-s, so streams outlive the grace period and are
handed back). After each, the victim is started again (or resumed) and the load goes on. A
round whose signal found the victim between streams (the router's log shows none moved)
signals again, at most `STRIKE_TRIES` times (`signals_per_round`).

Every request is deterministic (greedy, or sampled with a seed) and asks for exactly
`max_tokens` tokens (`ignore_eos`) with their logprobs, so each is checked against the same
request sent alone before the fault: its text (`mismatched`) and, per choice, the number of
tokens the client received and the usage counted (`duplicated`: more than `max_tokens`,
`missing`: fewer; `mismatched_*`: text, among migrated and unmigrated requests). Which
requests migrated comes from the router's log (its request ids are the clients'
x-request-id). The report per fault: requests sent, migrated, the latency of a
migrated request against the unmigrated ones (p50 / p99, and the difference), client-visible
errors, hung, lost, duplicated and missing tokens, mismatched text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.chaos.cluster import blocks_leaked, wait_healthy
from benchmarks.chaos.load import Load, Outcome, classify_stream
from benchmarks.chaos.stack import Plan, start_process
from benchmarks.common.sse_client import stream
from benchmarks.common.stats import percentile
from services.stack.runner import Stack

VICTIM = "executor-1"
MAX_TOKENS = 64
PROMPTS = [
    "The quick brown fox jumps over the lazy dog and then",
    "Once upon a time in a land far away there lived a",
    "In the beginning the universe was created. This has made a lot of people",
    "A shared system prompt that many requests begin with, followed by question number",
]


@dataclass(frozen=True)
class Shape:
    """A request shape; every one is deterministic."""

    stream: bool
    n: int
    seed: int | None  # None: greedy


SHAPES = [Shape(True, 1, None), Shape(True, 1, 7), Shape(True, 2, 11), Shape(False, 1, None)]
# The victim's grace period in the drain fault: shorter than most requests, so that streams
# outlive it and are handed back (the tiny model streams 64 tokens in a fraction of a second).
DRAIN_TIMEOUT_S = 0.1
# The victim's gauge says it runs sequences, yet the tiny model's streams can all end in the
# moment before the signal lands; a round signals again (after the cluster is whole) until the
# router's log shows streams it moved, at most this many times.
STRIKE_TRIES = 3


def request_body(prompt: int, shape: int, model: str = "quire-tiny") -> dict[str, Any]:
    """The completions request of one prompt and shape."""
    spec = SHAPES[shape]
    body: dict[str, Any] = {
        "model": model,
        "prompt": PROMPTS[prompt],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "logprobs": 0,
        "n": spec.n,
        "temperature": 0.0 if spec.seed is None else 0.8,
    }
    if spec.seed is not None:
        body["seed"] = spec.seed
    if spec.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


@dataclass
class Checked:
    """One request of the continuity load: its outcome and what it delivered."""

    outcome: Outcome
    key: tuple[int, int]  # (prompt, shape)
    request_id: str
    texts: dict[int, str] = field(default_factory=dict)
    num_tokens: dict[int, int] = field(default_factory=dict)
    completion_tokens: int | None = None


async def send(
    client: httpx.AsyncClient, url: str, key: tuple[int, int], deadline_s: float, model: str
) -> Checked:
    """Send one request of `key`'s prompt and shape under a fresh x-request-id."""
    body = request_body(*key, model=model)
    request_id = uuid.uuid4().hex
    headers = {"x-request-id": request_id}
    start = time.monotonic()
    if body.get("stream"):
        record = await stream(
            client, f"{url}/v1/completions", body, deadline_s=deadline_s, headers=headers
        )
        out = Outcome("stream", "hung", start, time.monotonic())
        classify_stream(record, out)
        checked = Checked(out, key, request_id, dict(record.texts), dict(record.num_tokens))
        checked.completion_tokens = record.usage.completion_tokens if record.usage else None
        return checked
    out = Outcome("plain", "hung", start, 0.0)
    checked = Checked(out, key, request_id)
    try:
        resp = await asyncio.wait_for(
            client.post(f"{url}/v1/completions", json=body, headers=headers), deadline_s
        )
    except TimeoutError:
        out.end = time.monotonic()
        return checked
    except httpx.TransportError as exc:
        out.bucket, out.detail, out.end = "lost", repr(exc), time.monotonic()
        return checked
    out.end, out.status = time.monotonic(), resp.status_code
    out.executors = resp.headers.get("x-quire-executor", "")
    if resp.status_code != 200:
        out.bucket, out.detail = "failed_clean", f"{resp.status_code}: {resp.text[:200]}"
        return checked
    data = resp.json()
    out.bucket = "completed"
    for choice in data.get("choices", []):
        index = int(choice.get("index") or 0)
        checked.texts[index] = choice.get("text", "")
        checked.num_tokens[index] = len((choice.get("logprobs") or {}).get("tokens") or ())
    checked.completion_tokens = (data.get("usage") or {}).get("completion_tokens")
    return checked


class ContinuityLoad(Load):
    """Closed-loop clients sending the deterministic requests of `SHAPES` x `PROMPTS`."""

    def __init__(self, url: str, concurrency: int, seed: int, model: str = "quire-tiny") -> None:
        super().__init__([url], concurrency=concurrency, seed=seed, deadline_s=60.0)
        self.model = model
        self.checked: list[Checked] = []

    async def _client(self, i: int) -> None:
        rng = random.Random(self.seed * 1000 + i)
        async with httpx.AsyncClient(timeout=self.deadline_s) as client:
            while not self.stop.is_set():
                key = (rng.randrange(len(PROMPTS)), rng.randrange(len(SHAPES)))
                checked = await send(client, self.urls[0], key, self.deadline_s, self.model)
                self.checked.append(checked)
                self.outcomes.append(checked.outcome)
                if checked.outcome.detail.startswith("refused"):
                    await asyncio.sleep(0.05)


async def references(url: str, model: str = "quire-tiny") -> dict[tuple[int, int], Checked]:
    """Every prompt and shape sent alone, one at a time: what each request must deliver."""
    refs = {}
    async with httpx.AsyncClient(timeout=60) as client:
        for prompt in range(len(PROMPTS)):
            for shape in range(len(SHAPES)):
                checked = await send(client, url, (prompt, shape), 60.0, model)
                if checked.outcome.bucket != "completed":
                    raise RuntimeError(f"reference {prompt, shape}: {checked.outcome.detail}")
                refs[(prompt, shape)] = checked
    return refs


def count_migrations(lines: Iterable[bytes | str]) -> dict[str, int]:
    """request id -> streams of it the router continued elsewhere, from its JSON log lines."""
    counts: dict[str, int] = {}
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        event = str(entry.get("event", "")) if isinstance(entry, dict) else ""
        if event.startswith("executor lost") and "continued" in event:
            rid = str(entry.get("request_id", ""))
            counts[rid] = counts.get(rid, 0) + 1
    return counts


def migrations_by_request(log_path: Path, offset: int = 0) -> dict[str, int]:
    """`count_migrations` of a router's log file from byte `offset`."""
    with log_path.open("rb") as f:
        f.seek(offset)
        return count_migrations(f)


def report(
    checked: list[Checked], refs: dict[tuple[int, int], Checked], migrated: dict[str, int]
) -> dict[str, Any]:
    """The per-fault figures (see the module docstring)."""
    buckets = {b: 0 for b in ("completed", "failed_clean", "hung", "lost")}
    errors: list[str] = []
    duplicated = missing = usage_wrong = 0
    mismatched = {True: 0, False: 0}  # migrated or not -> requests whose text differs
    latency: dict[bool, list[float]] = {True: [], False: []}
    for c in checked:
        buckets[c.outcome.bucket] = buckets.get(c.outcome.bucket, 0) + 1
        if c.outcome.bucket != "completed":
            if len(errors) < 5:
                errors.append(f"{c.outcome.kind} {c.outcome.bucket} {c.outcome.detail}"[:300])
            continue
        n = SHAPES[c.key[1]].n
        counts = [c.num_tokens.get(i, 0) for i in range(n)]
        duplicated += sum(k > MAX_TOKENS for k in counts)
        missing += sum(k < MAX_TOKENS for k in counts)
        usage_wrong += c.completion_tokens != MAX_TOKENS * n
        was_migrated = c.request_id in migrated
        if c.texts != refs[c.key].texts:
            mismatched[was_migrated] += 1
        latency[was_migrated].append(c.outcome.end - c.outcome.start)

    def pct(values: list[float], q: float) -> float | None:
        return round(percentile(values, q), 3) if values else None

    moved, still = latency[True], latency[False]
    result: dict[str, Any] = {
        "sent": len(checked),
        **buckets,
        "client_visible_errors": buckets["failed_clean"] + buckets["lost"],
        "migrated": len(moved),
        "migrations": sum(migrated.get(c.request_id, 0) for c in checked),
        "duplicated": duplicated,
        "missing": missing,
        "usage_wrong": usage_wrong,
        # Text unlike the request sent alone, among migrated and unmigrated requests: the
        # unmigrated count is the baseline of batch-dependent numerics (a near-tie decided
        # differently in another batch), against which the migrated one is read.
        "mismatched_migrated": mismatched[True],
        "mismatched_unmigrated": mismatched[False],
        "latency_s": {
            "migrated": {"p50": pct(moved, 0.5), "p99": pct(moved, 0.99)},
            "unmigrated": {"p50": pct(still, 0.5), "p99": pct(still, 0.99)},
        },
    }
    if moved and still:
        result["added_latency_s"] = {
            q: round(percentile(moved, v) - percentile(still, v), 3)
            for q, v in (("p50", 0.5), ("p99", 0.99))
        }
    if errors:
        result["examples"] = errors
    return result


@contextmanager
def executor_env(**values: str) -> Iterator[None]:
    """QUIRE_* settings for the processes a stack started inside starts with."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def strike_under_load(
    url: str,
    plan: Plan,
    strike: Callable[[], Awaitable[None]],
    seed: int,
    model: str = "quire-tiny",
) -> tuple[list[Checked], dict[tuple[int, int], Checked], list[float]]:
    """References, then the load with `strike` (a fault and the wait until the cluster is
    whole again) `plan.fault_rounds` times, each after `plan.before_s`, then `plan.after_s`
    more; what every request delivered, the references and each strike's seconds."""
    refs = await references(url, model)
    load = ContinuityLoad(url, plan.concurrency, seed, model)
    load.start()
    seconds: list[float] = []
    try:
        for _ in range(plan.fault_rounds):
            await asyncio.sleep(plan.before_s)
            t_fault = time.monotonic()
            await strike()
            seconds.append(round(time.monotonic() - t_fault, 2))
        await asyncio.sleep(plan.after_s)
    finally:
        await load.finish()
    return load.checked, refs, seconds


async def run_fault(
    stack: Stack, plan: Plan, inject: Callable[[Stack], Awaitable[None]], seed: int
) -> dict[str, Any]:
    """`inject` on a local stack under the continuity load; the figures."""
    log_path = stack.log_path("router")
    offset = log_path.stat().st_size

    tries: list[int] = []  # per round: the signals it took to land on a stream

    async def strike() -> None:
        for attempt in range(1, STRIKE_TRIES + 1):
            before = log_path.stat().st_size
            await inject(stack)
            await wait_healthy(stack.config.router_admin_url, stack.config.num_executors, 90.0)
            if migrations_by_request(log_path, before) or attempt == STRIKE_TRIES:
                tries.append(attempt)
                return

    checked, refs, seconds = await strike_under_load(stack.config.router_url, plan, strike, seed)
    result = report(checked, refs, migrations_by_request(log_path, offset))
    result["rounds"] = plan.fault_rounds
    result["signals_per_round"] = tries
    result["fault_to_healthy_s"] = seconds
    result["blocks_leaked"] = await blocks_leaked(stack.config.router_admin_url)
    return result


async def until_streaming(stack: Stack, timeout_s: float = 10.0) -> bool:
    """Wait (a bounded time) until the victim runs sequences by its own gauge, read from its
    /metrics (refreshed every 0.1 s while it works: fresher than its liveness record), so the
    fault lands on streams rather than between them; whether it did."""
    c = stack.config
    url = f"http://{c.host}:{c.executor_base_metrics_port + int(VICTIM.split('-')[1])}/metrics"
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                text = (await client.get(url)).text
                for family in text_string_to_metric_families(text):
                    if family.name.endswith("num_requests_running") and any(
                        s.value > 0 for s in family.samples
                    ):
                        return True
            await asyncio.sleep(0.01)
    return False


async def kill(stack: Stack) -> None:
    await until_streaming(stack)
    stack.signal(VICTIM, signal.SIGKILL)
    await asyncio.sleep(1.0)
    await start_process(stack, VICTIM, 90.0)


async def pause(stack: Stack) -> None:
    """SIGSTOP until the router has given up on the victim's streams (its stall bound and a
    second), then SIGCONT."""
    stall_s = float(os.environ.get("QUIRE_EXECUTOR_STALL_S", "10"))
    await until_streaming(stack)
    stack.signal(VICTIM, signal.SIGSTOP)
    try:
        await asyncio.sleep(stall_s + 2.0)
    finally:
        stack.signal(VICTIM, signal.SIGCONT)


async def drain(stack: Stack) -> None:
    await until_streaming(stack)
    stack.signal(VICTIM, signal.SIGTERM)
    code = await asyncio.to_thread(stack.procs[VICTIM].wait, 60)
    if code != 0:
        raise RuntimeError(f"{VICTIM} exited {code} after SIGTERM")
    await start_process(stack, VICTIM, 90.0)


MIGRATION_FAULTS: dict[str, Callable[[Stack], Awaitable[None]]] = {
    "migrate_kill": kill,
    "migrate_pause": pause,
    "migrate_drain": drain,
}


def migration_env(name: str) -> dict[str, str]:
    """The stack settings a migration fault runs with."""
    return {"QUIRE_DRAIN_TIMEOUT_S": str(DRAIN_TIMEOUT_S)} if name == "migrate_drain" else {}


def failures(result: dict[str, Any]) -> list[str]:
    """What the issue's bar forbids in one fault's figures."""
    keys = ("client_visible_errors", "hung", "lost", "duplicated", "missing", "usage_wrong")
    bad = [f"{k}={result[k]}" for k in keys if result.get(k)]
    if result.get("drains_within_grace"):
        # Streams finish on the draining executor: what shows the fault hit them is that
        # every signal came while it ran sequences.
        if not result.get("struck_mid_stream") or not all(result["struck_mid_stream"]):
            bad.append(
                f"struck_mid_stream={result.get('struck_mid_stream')} (a restart hit no stream)"
            )
    elif not result.get("migrated"):
        bad.append("migrated=0 (the fault hit no stream)")
    return bad
