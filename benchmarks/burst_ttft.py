"""A burst's first tokens served against the same prompts prefilled offline in one step.

    python -m benchmarks.burst_ttft [--model PATH] [--dtype bfloat16] [--prompts 16]
        [--words 100] [--bursts 3]

Offline: `--prompts` prompts (`--words` random common words each, a fresh seed per burst, so
no prefix is shared) go to `LLM.generate` at once, one output token each, prefix caching off:
their prefill is one engine step, timed after warm-up bursts. Served: the same prompts sent at
once to Quire's stack (one executor with every core, as `make bench-serving` runs it) as
streaming completions, each request's time to its first text chunk recorded. Where the served
p50 exceeds the offline burst, the difference is what serving a burst costs: the HTTP and gRPC
hops, and the steps the arrivals are spread over (the first request to reach an idle executor
starts a step of its own; the rest wait for it). Writes bench/results/burst_ttft.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.offline.machine import machine_info

RESULTS_PATH = Path("bench/results/burst_ttft.json")
WORDS = (  # noqa: SIM905 (a sentence's worth of words reads better as text)
    "the of and to in is was that for on as with by at from his her an be this which or are "
    "had not but one all were they you we their has have would what when there can more time"
).split()


def prompts(seed: int, count: int, words: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(count)]


def offline_bursts(args: argparse.Namespace) -> list[float]:
    """Seconds each measured burst's one-token generate took, offline."""
    from quire import LLM, SamplingParams

    llm = LLM(model=str(args.model), dtype=args.dtype, enable_prefix_caching=False)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    seconds = []
    for burst in range(args.warmup + args.bursts):
        texts = prompts(burst, args.prompts, args.words)
        started = time.perf_counter()
        llm.generate(texts, params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        if burst >= args.warmup:
            seconds.append(elapsed)
        print(f"offline burst {burst}: {elapsed * 1e3:.0f} ms", flush=True)
    del llm
    gc.collect()
    return seconds


async def first_token_s(client: httpx.AsyncClient, url: str, model: str, text: str) -> float:
    body = {"model": model, "prompt": text, "max_tokens": 2, "temperature": 0, "stream": True}
    started = time.perf_counter()
    first = None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if (
                first is None
                and line.startswith("data: {")
                and json.loads(line[6:])["choices"][0]["text"]
            ):
                first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("a request streamed no text")
    return first


async def served_bursts(args: argparse.Namespace, url: str, model: str) -> list[list[float]]:
    """Each measured burst's first-token seconds, served."""
    limits = httpx.Limits(max_connections=4 * args.prompts)
    bursts = []
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        for burst in range(args.warmup + args.bursts):
            texts = prompts(burst, args.prompts, args.words)
            ttfts = await asyncio.gather(*(first_token_s(client, url, model, t) for t in texts))
            if burst >= args.warmup:
                bursts.append(sorted(ttfts))
            print(
                f"served burst {burst}: TTFT p50 {statistics.median(ttfts) * 1e3:.0f} ms",
                flush=True,
            )
    return bursts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/smollm2-135m-instruct"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--words", type=int, default=100)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    args = parser.parse_args()
    from benchmarks.online.servers import quire_server

    offline = offline_bursts(args)
    with (
        tempfile.TemporaryDirectory() as run_dir,
        quire_server(args.model, 1, Path(run_dir), args.dtype) as server,
    ):
        served = asyncio.run(served_bursts(args, server.base_url, server.model))
    offline_ms = statistics.median(offline) * 1e3
    served_p50_ms = statistics.median(statistics.median(b) for b in served) * 1e3
    result: dict[str, Any] = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": machine_info(),
        "offline_burst_ms": [round(s * 1e3, 1) for s in offline],
        "served_ttft_ms": [[round(s * 1e3, 1) for s in b] for b in served],
        "offline_burst_median_ms": round(offline_ms, 1),
        "served_ttft_p50_median_ms": round(served_p50_ms, 1),
        "served_over_offline": round(served_p50_ms / offline_ms, 3),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    first = statistics.median(b[0] for b in served) * 1e3
    print(
        f"{args.prompts} prompts of {args.words} words, {args.dtype}: offline one step "
        f"{offline_ms:.0f} ms; served TTFT p50 {served_p50_ms:.0f} ms "
        f"({result['served_over_offline']}x), the first request's {first:.0f} ms"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
