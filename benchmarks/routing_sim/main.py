"""`python -m benchmarks.routing_sim`: the router's policies on 8 and 32 modelled executors.

The same workloads as the stack benchmark (benchmarks.routing.workloads), scaled with the
executor count so each executor gets the load it gets in the 2-executor run (conversations and
rates times executors / 2; tenants: max(4, executors / 2) system prompts; long-context: its
tenants, users and user rate times executors / 2, each executor's cache the workload's KV
size), through the real policy classes (quire.cluster.policies) onto the executor model of
benchmarks.routing_sim.model, every policy with pulls on and off, with service rates measured
on this machine's engine (calibrate.py) and the pull rate `make bench-pulls` measured
(load_pull_rate). Writes bench/results/routing-sim.json and routing-sim-<N>.png per size.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.report import write_json
from benchmarks.routing import workloads
from benchmarks.routing.main import FULL, QUICK
from benchmarks.routing.oracle import oracle_hit_rate
from benchmarks.routing.plot import plot
from benchmarks.routing.summary import PULLS, long_context_targets, variant
from benchmarks.routing_sim import calibrate
from benchmarks.routing_sim.model import Rates, SimRequest, simulate
from quire.cluster.placement import WorkingSets
from quire.cluster.policies import POLICY_NAMES, make_policy
from quire.cluster.recent import RecentRoutes
from quire.cluster.routing import RoutingConfig

REPO = Path(__file__).resolve().parents[2]
BLOCK_SIZE = 16
# Seconds to pull one token's K/V when bench/results/pulls.json is absent: the median of the
# pull ms / token `make bench-pulls` recorded in docs/benchmarks.md (0.093, 0.143, 0.271 ms).
PULL_S_PER_TOKEN = 0.143e-3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.routing_sim", description=__doc__)
    p.add_argument("--executors", default="8,32", help="cluster sizes, comma separated")
    p.add_argument("--quick", action="store_true", help="the stack benchmark's --quick sizes")
    p.add_argument("--workloads", default=",".join(workloads.WORKLOADS), help="comma separated")
    p.add_argument(
        "--cache-blocks",
        type=int,
        default=1024,
        help="prefix cache per executor (long-context: its own KV size)",
    )
    p.add_argument("--model", default=str(REPO / "models" / "smollm2-135m-instruct"))
    p.add_argument(
        "--data",
        default=str(REPO / "data" / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json"),
    )
    p.add_argument("--rates", type=Path, default=REPO / "bench" / "results" / "routing-rates.json")
    p.add_argument("--recalibrate", action="store_true", help="measure the rates again")
    p.add_argument(
        "--pulls-json",
        type=Path,
        default=REPO / "bench" / "results" / "pulls.json",
        help="make bench-pulls' results, for the pull rate (absent: PULL_S_PER_TOKEN)",
    )
    p.add_argument("--dtype", default="float32", help="the engine's dtype when measuring")
    p.add_argument(
        "--recent-s", type=float, default=0.0, help="the prefix policy's --routing-recent-s"
    )
    p.add_argument(
        "--placement-window-s",
        type=float,
        default=60.0,
        help="the prefix policy's --routing-placement-window-s (0: new prefixes by hash alone)",
    )
    p.add_argument("--seed", type=int, default=0, help="the workloads' seed")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "routing-sim.json")
    return p.parse_args(argv)


def load_rates(args: argparse.Namespace) -> tuple[Rates, dict[str, Any]]:
    """The measured rates (from the JSON, or measured now and written there)."""
    if args.recalibrate or not args.rates.is_file():
        print("measuring the engine's prefill and decode rates (one torch thread) ...", flush=True)
        write_json(args.rates, calibrate.measure(args.model, args.dtype))
    raw = json.loads(args.rates.read_text())
    steps = {int(b): s for b, s in raw["decode_step_s"].items()}
    (b1, s1), (b2, s2) = sorted(steps.items())[:2]
    per_seq = max(0.0, (s2 - s1) / (b2 - b1))
    return Rates(raw["prefill_tok_s"], max(1e-4, s1 - per_seq * b1), per_seq), raw


def load_pull_rate(path: Path) -> tuple[float, str]:
    """Seconds per pulled token: the median of make bench-pulls' per-length figures at `path`,
    else PULL_S_PER_TOKEN; and where it came from."""
    if not path.is_file():
        return PULL_S_PER_TOKEN, "PULL_S_PER_TOKEN (docs/benchmarks.md, make bench-pulls)"
    summary = json.loads(path.read_text())["summary"]
    ms = float(np.median([row["pull_ms_per_token"] for row in summary]))
    return ms / 1000.0, str(path)


def scaled(base: workloads.WorkloadConfig, n: int) -> workloads.WorkloadConfig:
    k = n / 2
    return replace(
        base,
        num_conversations=int(base.num_conversations * k),
        tenant_requests=int(base.tenant_requests * k),
        conversation_rate=base.conversation_rate * k,
        request_rate=base.request_rate * k,
        num_tenants=max(base.num_tenants, n // 2),
        context_tenants=int(base.context_tenants * k),
        context_users=int(base.context_users * k),
        context_user_rate=base.context_user_rate * k,
    )


def summary(result: Any) -> dict[str, Any]:
    ttft = np.asarray(result.ttft) * 1000
    tpot = [
        (e - t) / (o - 1) * 1000
        for t, e, o in zip(result.ttft, result.e2e, result.output_tokens, strict=True)
        if o > 1
    ]
    busiest = max(result.requests_per_executor.values())
    return {
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_p99_ms": float(np.percentile(ttft, 99)),
        "tpot_p99_ms": float(np.percentile(tpot, 99)) if tpot else None,
        "output_tok_s": sum(result.output_tokens) / result.duration_s,
        "hit_rate": result.cached_tokens / result.prompt_tokens,
        "pulled_share": result.pulled_tokens / result.prompt_tokens,
        "duration_s": result.duration_s,
        "busiest_executor_share": busiest / sum(result.requests_per_executor.values()),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from transformers import AutoTokenizer

    rates, raw = load_rates(args)
    pull_s, pull_source = load_pull_rate(args.pulls_json)
    rates = replace(rates, pull_s_per_token=pull_s)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    extra_key = Path(args.model).name
    base = QUICK if args.quick else FULL
    results: dict[str, Any] = {
        "rates": raw,
        "pull_s_per_token": pull_s,
        "pull_rate_from": pull_source,
        "cache_blocks": args.cache_blocks,
        "recent_s": args.recent_s,
        "placement_window_s": args.placement_window_s,
        "seed": args.seed,
        "sizes": {},
    }
    t0 = time.monotonic()
    for n in [int(x) for x in args.executors.split(",") if x]:
        config = replace(scaled(base, n), seed=args.seed)
        size: dict[str, Any] = {"config": config.__dict__, "workloads": {}}
        for name in [w for w in args.workloads.split(",") if w]:
            reqs = workloads.build(name, args.data, tokenizer, config)
            sim_reqs = [SimRequest(r.prompt_token_ids, r.output_len, r.at, r.after) for r in reqs]
            oracle = oracle_hit_rate([r.prompt_token_ids for r in reqs], BLOCK_SIZE, extra_key)
            entry: dict[str, Any] = {
                "num_requests": len(reqs),
                "oracle_hit_rate": oracle,
                "policies": {},
            }
            cache_blocks = workloads.kv_blocks(name, config) or args.cache_blocks
            entry["cache_blocks"] = cache_blocks
            for policy in POLICY_NAMES:
                for pulls in PULLS:
                    routing = RoutingConfig(block_size=BLOCK_SIZE, pulls=pulls == "on")
                    r = simulate(
                        make_policy(
                            policy,
                            routing,
                            RecentRoutes(args.recent_s),
                            WorkingSets(args.placement_window_s),
                        ),
                        sim_reqs,
                        n,
                        rates,
                        cache_blocks,
                        BLOCK_SIZE,
                        extra_key,
                        pulls=pulls == "on",
                    )
                    s = summary(r)
                    key = variant(policy, pulls)
                    entry["policies"][key] = s
                    print(
                        f"[sim {n:2d} executors] [{name:12s}] {key:21s} TTFT p50 "
                        f"{s['ttft_p50_ms']:8.0f} ms  p99 {s['ttft_p99_ms']:8.0f} ms  "
                        f"{s['output_tok_s']:7.1f} tok/s  hit {s['hit_rate']:.3f} (oracle "
                        f"{oracle:.3f}, pulled {s['pulled_share']:.3f})  busiest executor "
                        f"{s['busiest_executor_share']:.2f}",
                        flush=True,
                    )
            if name == "long-context":
                entry["targets"] = long_context_targets(entry["policies"], oracle)
                for key, t in entry["targets"].items():
                    met = "met" if t["met"] else "NOT met"
                    print(
                        f"[sim {n:2d} executors] [{name}] target {key}: {t['value']:.3f} "
                        f"({t['target']}) {met}",
                        flush=True,
                    )
            size["workloads"][name] = entry
        results["sizes"][str(n)] = size
        write_json(args.out, results)
        png = args.out.with_name(f"{args.out.stem}-{n}.png")
        plot(size, png, f"simulated routing policies, {n} executors")
    results["total_s"] = time.monotonic() - t0
    write_json(args.out, results)
    print(f"wrote {args.out} and its PNGs ({results['total_s']:.0f} s)", flush=True)
    return 0
