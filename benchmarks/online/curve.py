"""The latency-throughput curve: each server driven at concurrency 1, 4, 16 and all at once.

At a point of max concurrency c, the point's requests go out in order with at most c in flight
(each next one as soon as one finishes: `vllm bench serve --max-concurrency c`); "all" sends
them at once. Every system gets the same fresh requests per point (benchmarks.online.requests),
by vLLM's client (its custom dataset: these very prompts and output lengths, in this order) or
by this benchmark's own (benchmarks.online.client). Same-run ratios compare Quire with each
peer in one dtype, point by point, oriented so that above 1 means Quire is ahead.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from pathlib import Path
from typing import Any

from benchmarks.common.stats import number_at, ratio
from benchmarks.online.client import Server, run_concurrent, run_rate
from benchmarks.online.requests import Request
from benchmarks.online.scoring import summarize
from benchmarks.online.vllm_client import vllm_client_point

# The ratios each point reports: (key, figure, Quire in the numerator?).
RATIOS = (
    ("output_throughput", ("output_throughput",), True),
    ("ttft_p50", ("ttft_ms", "median"), False),
    ("tpot_p50", ("tpot_ms", "median"), False),
)


def point_label(max_concurrency: int | None) -> str:
    return "all" if max_concurrency is None else str(max_concurrency)


def run_point(
    server: Server,
    requests: list[Request],
    max_concurrency: int | None,
    client: str,
    args: argparse.Namespace,
    tmp: Path,
    label: str,
) -> dict[str, Any]:
    """One point of the curve by one client."""
    desc = f"{label} c={point_label(max_concurrency)}"
    if client == "vllm":
        point = vllm_client_point(server, requests, max_concurrency, args, tmp, label)
    else:
        if max_concurrency is None:
            run = run_rate(server, requests, math.inf, args.seed, desc)
        else:
            run = run_concurrent(server, requests, max_concurrency, desc)
        results, duration = asyncio.run(run)
        point = summarize(results, duration, math.inf, args.slo_ttft_ms, args.slo_tpot_ms)
        point = {"status": "ok" if not point["failed"] else "failed", **point}
    expected = sum(r.output_len for r in requests)
    return {
        "max_concurrency": max_concurrency,
        # where the point sits on a concurrency axis: "all" is every request of the point
        "concurrency": max_concurrency or len(requests),
        "client": client,
        "num_prompts": len(requests),
        # ignore_eos: every request makes exactly its output length; a client that counts
        # otherwise (vLLM's re-tokenizes the text when a server sends no separate usage chunk)
        # shows here
        "expected_output_tokens": expected,
        "output_tokens_as_expected": point.get("total_output_tokens") == expected,
        **point,
    }


def point_ratios(quire: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    """Quire against a peer at one point: throughput Quire / peer, latencies peer / Quire."""
    out: dict[str, Any] = {"max_concurrency": quire["max_concurrency"]}
    for key, path, quire_on_top in RATIOS:
        q, p = number_at(quire, *path), number_at(peer, *path)
        ok = quire.get("status") == "ok" and peer.get("status") == "ok"
        out[key] = (ratio(q, p) if quire_on_top else ratio(p, q)) if ok else None
    return out


def curve_ratios(quire: dict[str, Any], peer: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per client, per point both systems ran: point_ratios."""
    out: dict[str, list[dict[str, Any]]] = {}
    for client, points in (quire.get("curve") or {}).items():
        theirs = {p["max_concurrency"]: p for p in (peer.get("curve") or {}).get(client, [])}
        out[client] = [
            point_ratios(p, theirs[p["max_concurrency"]])
            for p in points
            if p["max_concurrency"] in theirs
        ]
    return out
