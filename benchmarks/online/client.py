"""The servers under test, how to ask each for exactly n tokens, and Poisson runs of streams."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
from tqdm.auto import tqdm

from benchmarks.common.sse import StreamRecord
from benchmarks.common.sse_client import stream
from benchmarks.online.config import REQUEST_TIMEOUT_S
from benchmarks.online.requests import Request, arrival_times


class Server:
    """An OpenAI-compatible endpoint and how to ask it for exactly n tokens."""

    name = "server"
    sends_done = True  # ends a stream with `data: [DONE]`

    def __init__(self, base_url: str, model: str) -> None:
        self.base_url = base_url
        self.model = model

    def body(self, req: Request) -> dict[str, Any]:
        raise NotImplementedError


class QuireServer(Server):
    name = "quire"

    def body(self, req: Request) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": req.prompt,
            "max_tokens": req.output_len,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }


class VLLMServer(QuireServer):
    """vLLM's OpenAI server takes the same body: ignore_eos is its own extension."""

    name = "vllm"


class LlamaCppServer(QuireServer):
    """llama-server takes the same body (ignore_eos is one of its sampling parameters)."""

    name = "llamacpp"


class TransformersServer(Server):
    name = "transformers"
    sends_done = False  # `transformers serve` closes the stream after its last chunk

    def body(self, req: Request) -> dict[str, Any]:
        # transformers serve rejects unknown fields (ignore_eos, stream_options) with a 422; a
        # generation_config replaces the model's, so it has no EOS and min_new_tokens holds.
        config = {"max_new_tokens": req.output_len, "min_new_tokens": req.output_len}
        return {
            "model": self.model,
            "prompt": req.prompt,
            "max_tokens": req.output_len,
            "stream": True,
            "generation_config": json.dumps({**config, "do_sample": False}),
        }


async def send(client: httpx.AsyncClient, server: Server, req: Request) -> StreamRecord:
    """One streaming completion, timed chunk by chunk (benchmarks.common.sse_client)."""
    url = f"{server.base_url}/v1/completions"
    return await stream(client, url, server.body(req), expect_done=server.sends_done)


async def run_rate(
    server: Server, requests: list[Request], rate: float, seed: int, desc: str
) -> tuple[list[StreamRecord], float]:
    """All requests at Poisson arrivals; returns the results and the run's seconds."""
    times = arrival_times(rate, len(requests), seed)
    limits = httpx.Limits(max_connections=len(requests) + 4, max_keepalive_connections=32)
    bar = tqdm(total=len(requests), desc=desc, leave=False, dynamic_ncols=True)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        t0 = time.perf_counter()

        async def one(req: Request, at: float) -> StreamRecord:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            r = await send(client, server, req)
            bar.update(1)
            return r

        results = await asyncio.gather(*(one(r, t) for r, t in zip(requests, times, strict=True)))
        duration = time.perf_counter() - t0
    bar.close()
    return list(results), duration


async def run_concurrent(
    server: Server, requests: list[Request], max_concurrency: int, desc: str
) -> tuple[list[StreamRecord], float]:
    """The requests in order, at most `max_concurrency` in flight (each next one sent as soon as
    one finishes, as `vllm bench serve --max-concurrency` does); the results and the seconds."""
    limits = httpx.Limits(max_connections=max_concurrency + 4, max_keepalive_connections=32)
    gate = asyncio.Semaphore(max_concurrency)
    bar = tqdm(total=len(requests), desc=desc, leave=False, dynamic_ncols=True)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        t0 = time.perf_counter()

        async def one(req: Request) -> StreamRecord:
            async with gate:
                r = await send(client, server, req)
            bar.update(1)
            return r

        results = await asyncio.gather(*(one(r) for r in requests))
        duration = time.perf_counter() - t0
    bar.close()
    return list(results), duration


async def gather_warmup(server: Server, requests: list[Request]) -> list[StreamRecord]:
    """One request alone, then all of them at once (batched shapes warm up too)."""
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        first = await send(client, server, requests[0])
        rest = await asyncio.gather(*(send(client, server, r) for r in requests))
        return [first, *rest]
