"""`make bench-routing`: every routing policy on the real local stack, same arrivals, cold caches.

For each policy, with pulls on and off (`--pulls`), a fresh stack (Redis, memory manager,
`--num-executors` executors pinned one core each with one torch thread, `--enable-pulls` or
not, a router with `--routing-policy` and the matching `--routing-pulls`) serves the same
seeded requests of each workload (benchmarks.routing.workloads; one stack per KV size a
workload asks for); the figures per policy and pulls setting go to bench/results/routing.json
and routing.png, beside the oracle hit rate of the workload. Then the simulation
(benchmarks.routing_sim) runs the same policies at 8 and 32 executors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common.report import write_json
from benchmarks.common.signals import exit_on_sigterm
from benchmarks.pulls import pull_counters
from benchmarks.routing import client, workloads
from benchmarks.routing.oracle import oracle_hit_rate
from benchmarks.routing.plot import plot
from benchmarks.routing.summary import (
    PULLS,
    long_context_targets,
    summarize,
    targets,
    variant,
)
from quire.cluster.policies import POLICY_NAMES
from services.stack.ports import stack_ports
from services.stack.runner import Stack
from services.stack.spec import StackConfig

REPO = Path(__file__).resolve().parents[2]
BLOCK_SIZE = 16  # the executors' default (ExecutorSettings.block_size)

# Sizes: the full run is ~10-15 min on 2 cores, --quick a ~2-3 min smoke run.
FULL = workloads.WorkloadConfig()
QUICK = workloads.WorkloadConfig(
    num_conversations=3,
    max_turns=3,
    conversation_rate=0.5,
    think_s=0.5,
    num_tenants=2,
    tenant_requests=6,
    system_prompt_len=128,
    request_rate=1.0,
    max_prompt_len=512,
    max_output_len=4,
    context_tenants=3,
    context_len=256,
    context_users=6,
    context_turns=2,
    context_turn_len=32,
    context_user_rate=0.5,
    context_kv_blocks=40,
)
# The executors' counters read around each workload (names without _total).
PULL_SERIES = (
    "quire_executor_pulls",
    "quire_executor_pulled_blocks",
    "quire_executor_pull_fallbacks",
    "quire_executor_pulls_declined",
    "quire_executor_num_preemptions",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.routing", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a small smoke run (~2-3 min)")
    p.add_argument("--policies", default=",".join(POLICY_NAMES), help="comma separated")
    p.add_argument("--workloads", default=",".join(workloads.WORKLOADS), help="comma separated")
    p.add_argument("--model", default=str(REPO / "models" / "smollm2-135m-instruct"))
    p.add_argument(
        "--data",
        default=str(REPO / "data" / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json"),
    )
    p.add_argument("--num-executors", type=int, default=2)
    p.add_argument("--dtype", default="float32", help="the executors' --dtype")
    p.add_argument(
        "--num-kv-blocks",
        type=int,
        default=1024,
        help="per executor, for the workloads that do not size it (long-context does)",
    )
    p.add_argument(
        "--pulls",
        default=",".join(PULLS),
        help="comma separated: on (executors pull, the router knows), off, or both",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "routing.json")
    p.add_argument("--no-sim", action="store_true", help="skip the simulation afterwards")
    return p.parse_args(argv)


def stack_config(
    args: argparse.Namespace, policy: str, pulls: str, num_kv_blocks: int
) -> StackConfig:
    """The stack of one run: `pulls` "on" or "off" for the executors and the router alike."""
    ports = stack_ports(args.num_executors)
    return StackConfig(
        model=args.model,
        **ports,
        num_executors=args.num_executors,
        num_kv_blocks=num_kv_blocks,
        executor_enable_pulls=pulls == "on",
        router_routing_pulls=pulls == "on",
        executor_torch_threads=1,
        pin_executors=True,
        executor_dtype=args.dtype,
        routing_policy=policy,
        redis_prefix=f"quire-routing-{ports['router_port']}",
        python=sys.executable,
    )


async def wait_healthy(admin_url: str, n: int, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=5.0) as http:
        while time.monotonic() < deadline:
            try:
                status = (await http.get(f"{admin_url}/cluster/status")).json()
                if sum(e["healthy"] for e in status["executors"]) >= n:
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"fewer than {n} healthy executors after {timeout_s:.0f} s")


async def warm_up(url: str, model: str, vocab: int, n: int) -> None:
    """A few short random prompts (no prefix shared with the workload) to load the kernels."""
    rng = np.random.default_rng(12345)
    reqs = [
        workloads.BenchRequest("warm-up", 0, rng.integers(1000, vocab, 40).tolist(), 4, 0.0)
        for _ in range(2 * n)
    ]
    outcomes, _ = await client.run(url, model, reqs)
    failed = [o.failure for o in outcomes if not o.ok]
    if failed:
        raise RuntimeError(f"warm-up failed: {failed[0]}")


def pull_totals(config: StackConfig) -> dict[str, float]:
    """PULL_SERIES summed over the executors; zeros where a metrics port does not answer."""
    totals = dict.fromkeys(PULL_SERIES, 0.0)
    for i in range(config.num_executors):
        url = f"http://{config.host}:{config.executor_base_metrics_port + i}/metrics"
        try:
            counters = pull_counters(url, PULL_SERIES)
        except httpx.HTTPError:
            continue
        for name, value in counters.items():
            totals[name] += value
    return totals


def routing_reasons(config: StackConfig) -> dict[str, float]:
    """The router's routing decisions so far, by reason (empty if /metrics does not answer)."""
    try:
        text = httpx.get(f"{config.router_admin_url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "quire_router_routing_decisions"
        for s in family.samples
        if s.name.endswith("_total")
    }


def run_policy(
    args: argparse.Namespace,
    policy: str,
    pulls: str,
    runs: dict[str, list[workloads.BenchRequest]],
    vocab: int,
    num_kv_blocks: int,
) -> dict[str, dict[str, Any]]:
    """One fresh stack for `policy` and `pulls`, the workloads one after another; figures per
    workload, with the executors' pull counters over each.

    The workloads share no prefix (the multi-turn prompts open with the model's default
    system prompt, the others with their own), so one stack serves them from cold caches.
    """
    config = stack_config(args, policy, pulls, num_kv_blocks)
    stack = Stack(config, REPO / ".run" / "bench-routing" / variant(policy, pulls), cwd=REPO)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    stack.start(timeout_s=240.0)
    out: dict[str, dict[str, Any]] = {}
    try:
        model = Path(args.model).name
        asyncio.run(wait_healthy(config.router_admin_url, args.num_executors))
        asyncio.run(warm_up(config.router_url, model, vocab, args.num_executors))
        ready_s = time.monotonic() - started
        for name, requests in runs.items():
            before, reasons_before = pull_totals(config), routing_reasons(config)
            outcomes, duration = asyncio.run(client.run(config.router_url, model, requests))
            after, reasons = pull_totals(config), routing_reasons(config)
            # Which tenants (long-context) or conversations each executor served.
            served: dict[str, set[str]] = {}
            for req, o in zip(requests, outcomes, strict=True):
                if o.ok and o.executor:
                    served.setdefault(o.executor, set()).add(req.group.split("/")[0])
            out[name] = {
                **summarize(outcomes, duration),
                "groups_per_executor": {e: sorted(g) for e, g in sorted(served.items())},
                "policy": policy,
                "pulls": pulls,
                "num_kv_blocks": num_kv_blocks,
                "executor_counters": {k: after[k] - before[k] for k in PULL_SERIES},
                "routing_reasons": {
                    k: v - reasons_before.get(k, 0.0) for k, v in sorted(reasons.items())
                },
                "stack_ready_s": ready_s,
                # The machine's 1-min load average around the run: comparable only when alike.
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg()[0],
            }
    finally:
        stack.stop()
    return out


def progress(name: str, key: str, r: dict[str, Any], oracle: float) -> None:
    def f(v: float | None, spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    pulled = r["executor_counters"]["quire_executor_pulled_blocks"]
    print(
        f"[{name:12s}] {key:21s} TTFT p50 {f(r['ttft_p50_ms'], '7.0f')} ms  p99 "
        f"{f(r['ttft_p99_ms'], '7.0f')} ms  TPOT p99 {f(r['tpot_p99_ms'], '6.0f')} ms  "
        f"{f(r['output_tok_s'], '6.1f')} tok/s  hit {f(r['hit_rate'], '.3f')} (oracle "
        f"{oracle:.3f}, pulled blocks {pulled:.0f})  failed {r['num_failed']}/{r['num_requests']}  "
        f"by executor {r['requests_per_executor']}  reasons {r['routing_reasons']}  "
        f"preemptions {r['executor_counters']['quire_executor_num_preemptions']:.0f}  "
        f"({r['duration_s']:.0f} s load, "
        f"loadavg {r['loadavg_before']:.1f} -> {r['loadavg_after']:.1f})",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    from transformers import AutoTokenizer

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    extra_key = Path(args.model).name
    base = QUICK if args.quick else FULL
    config = workloads.WorkloadConfig(**{**base.__dict__, "seed": args.seed})
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:
        if p not in POLICY_NAMES:
            raise SystemExit(f"unknown policy {p!r}; one of {', '.join(POLICY_NAMES)}")
    pull_settings = [p for p in args.pulls.split(",") if p]
    if not pull_settings or not set(pull_settings) <= set(PULLS):
        raise SystemExit(f"--pulls takes {', '.join(PULLS)}, comma separated")
    results: dict[str, Any] = {
        "config": {
            **config.__dict__,
            "quick": args.quick,
            "num_executors": args.num_executors,
            "num_kv_blocks": args.num_kv_blocks,
            "pulls": pull_settings,
            "model": extra_key,
            "executor_torch_threads": 1,
            "dtype": args.dtype,
            "pinned": True,
            "cpu_count": os.cpu_count(),
        },
        "workloads": {},
    }
    t0 = time.monotonic()
    # Workloads by the KV blocks per executor they run with: one stack per size.
    runs: dict[int, dict[str, list[workloads.BenchRequest]]] = {}
    for name in [w for w in args.workloads.split(",") if w]:
        requests = workloads.build(name, args.data, tokenizer, config)
        prompts = [r.prompt_token_ids for r in requests]
        oracle = oracle_hit_rate(prompts, BLOCK_SIZE, extra_key)
        num_kv_blocks = workloads.kv_blocks(name, config) or args.num_kv_blocks
        runs.setdefault(num_kv_blocks, {})[name] = requests
        results["workloads"][name] = {
            "num_kv_blocks": num_kv_blocks,
            "shared_context_blocks": workloads.shared_context_blocks(name, config, BLOCK_SIZE),
            "num_requests": len(requests),
            "prompt_tokens": sum(map(len, prompts)),
            "output_tokens": sum(r.output_len for r in requests),
            "oracle_hit_rate": oracle,
            "policies": {},
        }
        print(
            f"[{name:10s}] {len(requests)} requests, {sum(map(len, prompts))} prompt tokens, "
            f"{sum(r.output_len for r in requests)} output tokens, oracle hit rate {oracle:.3f}, "
            f"{num_kv_blocks} KV blocks per executor",
            flush=True,
        )
    # Pulls on and off alternate which runs first from one policy to the next, so neither
    # setting always meets the machine in the same state.
    for i, policy in enumerate(policies):
        for pulls in pull_settings if i % 2 == 0 else pull_settings[::-1]:
            for num_kv_blocks, group in runs.items():
                run = run_policy(args, policy, pulls, group, len(tokenizer), num_kv_blocks)
                for name, r in run.items():
                    entry = results["workloads"][name]
                    entry["policies"][variant(policy, pulls)] = r
                    progress(name, variant(policy, pulls), r, entry["oracle_hit_rate"])
                write_json(args.out, results)
    judged = {
        "multi-turn": lambda p, o: targets(p, o, "on" if "on" in pull_settings else "off"),
        "long-context": long_context_targets,
    }
    for name, judge in judged.items():
        if name not in results["workloads"]:
            continue
        entry = results["workloads"][name]
        entry["targets"] = judge(entry["policies"], entry["oracle_hit_rate"])
        for key, t in entry["targets"].items():
            met = "met" if t["met"] else "NOT met"
            print(f"[{name}] target {key}: {t['value']:.3f} ({t['target']}) {met}", flush=True)
    results["total_s"] = time.monotonic() - t0
    write_json(args.out, results)
    png = args.out.with_suffix(".png")
    plot(results, png, f"routing policies, {args.num_executors} executors ({extra_key})")
    print(f"wrote {args.out} and {png} ({results['total_s']:.0f} s)", flush=True)
    failed = sum(
        p["num_failed"] for w in results["workloads"].values() for p in w["policies"].values()
    )
    if not args.no_sim:
        from benchmarks.routing_sim.main import main as sim_main

        sim_main(["--quick"] if args.quick else [])
    return 1 if failed else 0
