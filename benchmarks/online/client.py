"""The benchmark's HTTP client: one streaming request timed chunk by chunk, and Poisson runs of them."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from tqdm.auto import tqdm

from benchmarks.online.config import REQUEST_TIMEOUT_S
from benchmarks.online.requests import Request, arrival_times


@dataclass
class Result:
    success: bool = False
    error: str = ""
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, if reported

    @property
    def tpot(self) -> float | None:
        if not self.success or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


class Server:
    """An OpenAI-compatible endpoint and how to ask it for exactly n tokens."""

    name = "server"

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


class TransformersServer(Server):
    name = "transformers"

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


async def send(client: httpx.AsyncClient, server: Server, req: Request) -> Result:
    """One streaming request, timed: TTFT, every gap between text chunks, e2e, usage."""
    result = Result()
    chunks = 0
    start = time.perf_counter()
    last = start
    try:
        async with client.stream(
            "POST", f"{server.base_url}/v1/completions", json=server.body(req)
        ) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                now = time.perf_counter()
                if chunk.get("usage"):
                    result.output_tokens = int(chunk["usage"].get("completion_tokens") or 0)
                    result.prompt_tokens = int(chunk["usage"].get("prompt_tokens") or 0)
                    details = chunk["usage"].get("prompt_tokens_details") or {}
                    if details.get("cached_tokens") is not None:
                        result.cached_tokens = int(details["cached_tokens"])
                if any(c.get("text") for c in chunk.get("choices") or []):
                    if chunks == 0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    chunks += 1
                    last = now
        result.e2e = time.perf_counter() - start
        result.output_tokens = result.output_tokens or chunks
        result.success = chunks > 0
        if not result.success:
            result.error = "no text in the stream"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def run_rate(
    server: Server, requests: list[Request], rate: float, seed: int, desc: str
) -> tuple[list[Result], float]:
    """All requests at Poisson arrivals; returns the results and the run's seconds."""
    times = arrival_times(rate, len(requests), seed)
    limits = httpx.Limits(max_connections=len(requests) + 4, max_keepalive_connections=32)
    bar = tqdm(total=len(requests), desc=desc, leave=False, dynamic_ncols=True)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        t0 = time.perf_counter()

        async def one(req: Request, at: float) -> Result:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            r = await send(client, server, req)
            bar.update(1)
            return r

        results = await asyncio.gather(*(one(r, t) for r, t in zip(requests, times, strict=True)))
        duration = time.perf_counter() - t0
    bar.close()
    return list(results), duration


async def gather_warmup(server: Server, requests: list[Request]) -> list[Result]:
    """One request alone, then all of them at once (batched shapes warm up too)."""
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        first = await send(client, server, requests[0])
        rest = await asyncio.gather(*(send(client, server, r) for r in requests))
        return [first, *rest]
