"""Closed-loop chaos load and the bucket each request ends in (see benchmarks.chaos)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.common.sse import StreamRecord
from benchmarks.common.sse_client import stream

BUCKETS = ("completed", "failed_clean", "hung", "lost", "disconnected")
PROMPTS = [
    "The quick brown fox jumps over the lazy dog and then",
    "Once upon a time in a land far away there lived a",
    "In the beginning the universe was created. This has made a lot of people",
    "A shared system prompt that many requests begin with, followed by question number",
]


@dataclass
class Outcome:
    """One request's fate."""

    kind: str
    bucket: str
    start: float  # monotonic
    end: float
    status: int = 0
    executors: str = ""  # x-quire-executor
    ttft: float | None = None  # first text chunk (streams)
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
    """Whether `text` is JSON holding an OpenAI error object."""
    with contextlib.suppress(ValueError):
        data = json.loads(text)
        return isinstance(data, dict) and isinstance(data.get("error"), dict)
    return False


async def one_request(
    client: httpx.AsyncClient, url: str, req: dict[str, Any], deadline_s: float
) -> Outcome:
    """Send one request and classify it."""
    out = Outcome(req["kind"], "hung", time.monotonic(), 0.0)
    body = req["body"]
    if body.get("stream"):
        max_events = 2 if req["kind"] == "disconnect" else None
        record = await stream(
            client, f"{url}/v1/completions", body, deadline_s=deadline_s, max_events=max_events
        )
        classify_stream(record, out)
    else:
        try:
            await asyncio.wait_for(_send_plain(client, url, body, out), deadline_s)
        except TimeoutError:
            out.bucket = "hung"
    out.end = time.monotonic()
    return out


async def _send_plain(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], out: Outcome
) -> None:
    try:
        resp = await client.post(f"{url}/v1/completions", json=body)
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
        out.bucket, out.detail = classify_error(
            resp.status_code, resp.headers.get("retry-after"), resp.text
        )


def classify_stream(record: StreamRecord, out: Outcome) -> None:
    """A stream's bucket from what the client recorded."""
    out.status, out.executors, out.ttft = record.status, record.executor, record.ttft
    if record.timed_out:
        out.bucket, out.detail = "hung", record.error
    elif record.status == 0:  # no response: the request was never accepted
        refused = isinstance(record.exception, httpx.ConnectError)
        out.bucket = "failed_clean"
        out.detail = f"refused: {record.exception!r}" if refused else record.error
    elif record.status != 200:
        out.bucket, out.detail = classify_error(record.status, record.retry_after, record.body)
    elif record.error_event is not None:
        out.bucket, out.detail = "failed_clean", record.error[:200]
    elif record.closed_early:
        out.bucket = "disconnected"
    elif record.done:
        out.bucket = "completed"
    else:  # accepted, then the stream broke or ended without [DONE]
        out.bucket, out.detail = "lost", record.error


def classify_error(status: int, retry_after: str | None, text: str) -> tuple[str, str]:
    """An error status is clean with an OpenAI error object, or as a 429/503 with Retry-After.

    Anything else (a bare status, an HTML page) counts as lost.
    """
    clear = has_error_object(text) or (status in (429, 503) and retry_after is not None)
    return ("failed_clean" if clear else "lost"), f"{status}: {text[:200]}"


def tally(outcomes: list[Outcome]) -> dict[str, Any]:
    """How many outcomes fell in each bucket, with a few hung or lost examples."""
    counts = {"sent": len(outcomes), **{b: 0 for b in BUCKETS}}
    examples: list[str] = []
    for o in outcomes:
        counts[o.bucket] += 1
        if o.bucket in ("hung", "lost") and len(examples) < 5:
            examples.append(f"{o.kind} {o.bucket} status={o.status} {o.detail}"[:300])
    return {**counts, "examples": examples} if examples else counts


def stream_body(seed: int) -> dict[str, Any]:
    """A short greedy streaming completion, its prompt picked by `seed`."""
    return {
        "model": "quire-tiny",
        "prompt": f"{PROMPTS[seed % len(PROMPTS)]} {seed}",
        "max_tokens": 16,
        "stream": True,
        "temperature": 0.0,
    }


def served_by(outcomes: list[Outcome], executor_id: str) -> list[Outcome]:
    """The outcomes that `executor_id` served (x-quire-executor)."""
    return [o for o in outcomes if executor_id in o.executors.split(",")]
