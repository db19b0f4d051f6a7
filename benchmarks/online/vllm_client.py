"""`vllm bench serve`, vLLM's own benchmark client, against a server under test."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from benchmarks.online.client import Server

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
