"""`vllm bench serve`, vLLM's own benchmark client, sending one curve point's requests."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.online.client import Server
from benchmarks.online.requests import Request

STATS = ("ttft", "tpot", "itl", "e2el")


def write_custom_dataset(requests: list[Request], path: Path) -> Path:
    """The requests as vLLM's custom dataset: one `{"prompt", "output_tokens"}` per line."""
    lines = [json.dumps({"prompt": r.prompt, "output_tokens": r.output_len}) for r in requests]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def point_from_vllm(result: dict[str, Any]) -> dict[str, Any]:
    """vLLM's result JSON in this benchmark's shape (benchmarks.online.scoring.summarize)."""
    point: dict[str, Any] = {
        "completed": result["completed"],
        "failed": result.get("failed", 0),
        "duration_s": result["duration"],
        "total_output_tokens": result["total_output_tokens"],
        "request_throughput": result["request_throughput"],
        "output_throughput": result["output_throughput"],
    }
    for stat in STATS:
        point[f"{stat}_ms"] = {
            "mean": result.get(f"mean_{stat}_ms"),
            "median": result.get(f"median_{stat}_ms"),
            "p99": result.get(f"p99_{stat}_ms"),
        }
    return point


def vllm_client_point(
    server: Server,
    requests: list[Request],
    max_concurrency: int | None,
    args: argparse.Namespace,
    tmp: Path,
    label: str,
) -> dict[str, Any]:
    """`vllm bench serve` sends exactly `requests`, in order, at most `max_concurrency` in flight
    (None: all at once); its figures in this benchmark's shape, or why it failed."""
    from benchmarks.peers.vllm_env import PEER_VENV
    from benchmarks.peers.vllm_server import run_vllm_bench_client

    if not any(PEER_VENV.glob("lib/python*/site-packages/pandas/__init__.py")):
        # a peer venv made before `make peer-vllm` installed it
        reason = f"vLLM's client reads request files with pandas, missing from {PEER_VENV}: "
        reason += f"rm {PEER_VENV}/.installed && make peer-vllm"
        return {"status": "failed", "reason": reason}
    dataset = write_custom_dataset(requests, tmp / f"requests-{label}.jsonl")
    try:
        result = run_vllm_bench_client(
            server.base_url,
            server.model,
            args.model_dir,
            dataset,
            num_prompts=len(requests),
            request_rate=math.inf,
            seed=args.seed,
            result_path=tmp / f"vllm-client-{label}.json",
            dataset_name="custom",
            max_concurrency=max_concurrency,
            timeout_s=3600,
        )
    except Exception as exc:  # the JSON says why; the other points still stand
        return {"status": "failed", "reason": str(exc)[-1500:]}
    point = point_from_vllm(result)
    if point["failed"]:
        errors = [e for e in result.get("errors") or [] if e][:3]
        return {"status": "failed", "reason": f"{point['failed']} failed: {errors}", **point}
    return {"status": "ok", **point}
