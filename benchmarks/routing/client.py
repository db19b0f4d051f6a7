"""Sends one workload to a router: streaming completions at the scheduled times, timed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import httpx

from benchmarks.common.sse import StreamRecord
from benchmarks.common.sse_client import stream
from benchmarks.routing.workloads import BenchRequest

REQUEST_TIMEOUT_S = 600.0


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


async def send(client: httpx.AsyncClient, url: str, model: str, req: BenchRequest) -> StreamRecord:
    """One request, timed; without a usage chunk it failed (the hit rate needs one)."""
    record = await stream(client, f"{url}/v1/completions", body(model, req))
    if record.ok and record.usage is None:
        record.fail("no usage in the stream")
    return record


async def run(
    url: str, model: str, requests: Sequence[BenchRequest]
) -> tuple[list[StreamRecord], float]:
    """Every request at its scheduled time (and after the turn it follows); the run's seconds."""
    done = [asyncio.Event() for _ in requests]
    records: list[StreamRecord | None] = [None] * len(requests)
    limits = httpx.Limits(max_connections=len(requests) + 4, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        t0 = time.perf_counter()

        async def one(i: int, req: BenchRequest) -> None:
            await asyncio.sleep(max(0.0, t0 + req.at - time.perf_counter()))
            if req.after is not None:
                await done[req.after].wait()
            records[i] = await send(client, url, model, req)
            done[i].set()

        await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        duration = time.perf_counter() - t0
    return [r for r in records if r is not None], duration
