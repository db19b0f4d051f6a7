"""Sends one workload to a router: streaming completions at the scheduled times, timed."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from benchmarks.routing.workloads import BenchRequest

REQUEST_TIMEOUT_S = 600.0


@dataclass
class Outcome:
    """What one request measured."""

    ok: bool = False
    error: str = ""
    executor: str = ""  # x-quire-executor: who served it
    sent_at: float = 0.0  # seconds from the run's start
    ttft: float = 0.0
    e2e: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens
    output_tokens: int = 0

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def body(model: str, req: BenchRequest) -> dict[str, object]:
    """A streaming completion of exactly `output_len` tokens over the request's token ids."""
    return {
        "model": model,
        "prompt": req.prompt_token_ids,
        "max_tokens": req.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def send(client: httpx.AsyncClient, url: str, model: str, req: BenchRequest) -> Outcome:
    out = Outcome()
    start = time.perf_counter()
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body(model, req)) as resp:
            out.executor = resp.headers.get("x-quire-executor", "")
            if resp.status_code != 200:
                out.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return out
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                usage = chunk.get("usage")
                if usage:
                    out.prompt_tokens = int(usage["prompt_tokens"])
                    out.output_tokens = int(usage["completion_tokens"])
                    details = usage.get("prompt_tokens_details") or {}
                    out.cached_tokens = int(details.get("cached_tokens") or 0)
                if not out.ttft and any(c.get("text") for c in chunk.get("choices") or []):
                    out.ttft = time.perf_counter() - start
        out.e2e = time.perf_counter() - start
        out.ok = out.ttft > 0 and out.prompt_tokens > 0
        if not out.ok:
            out.error = "no text or no usage in the stream"
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    return out


async def run(
    url: str, model: str, requests: Sequence[BenchRequest]
) -> tuple[list[Outcome], float]:
    """Every request at its scheduled time (and after the turn it follows); the run's seconds."""
    done = [asyncio.Event() for _ in requests]
    outcomes = [Outcome() for _ in requests]
    limits = httpx.Limits(max_connections=len(requests) + 4, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        t0 = time.perf_counter()

        async def one(i: int, req: BenchRequest) -> None:
            await asyncio.sleep(max(0.0, t0 + req.at - time.perf_counter()))
            if req.after is not None:
                await done[req.after].wait()
            sent_at = time.perf_counter() - t0
            outcome = await send(client, url, model, req)
            outcome.sent_at = sent_at
            outcomes[i] = outcome
            done[i].set()

        await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        duration = time.perf_counter() - t0
    return outcomes, duration
