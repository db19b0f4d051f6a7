"""`make bench-pulls`: what moving a prefix's KV between executors costs against computing it.

A real stack (memory manager, two executors, Redis, router) on the default model. For each
context length, executor-0 computes a random context; executor-1, holding nothing, is sent the
context plus a few tokens and pulls the context's full blocks from executor-0 (the memory
manager's offer, executor-0's ReadBlocks); then executor-1 is sent a fresh context of the same
length that nobody holds, which it computes. Both requests ask for one token, so their time to
first token is the prefix's cost: pulled, or computed. The executors' own pull counters
(`quire_executor_pulled_bytes_total`, `quire_executor_pull_seconds_total`) give the transfer
alone. Beside them, this machine's memory copy bandwidth on a buffer of the same size
(`torch` copy, best of 5), the ceiling any in-memory transfer meets.

Every request is warmed up once at the smallest length first; each length runs `--repeats`
times with fresh contexts, and the summary takes the fastest (a shared machine's slow runs are
the disturbed ones). Writes bench/results/pulls.json and pulls.png.

    python -m benchmarks.pulls --help
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common.report import fmt, pyplot, write_json
from benchmarks.offline.machine import machine_info
from quire import SamplingParams
from services.common.wire.executor import params_to_proto
from services.rpc import executor_pb2 as pb
from services.rpc import executor_pb2_grpc
from services.stack.ports import stack_ports
from services.stack.runner import Stack
from services.stack.spec import StackConfig

REPO = Path(__file__).resolve().parents[1]
PULL_SERIES = ("quire_executor_pulled_bytes", "quire_executor_pull_seconds")


def first_token_s(address: str, request_id: str, prompt: list[int]) -> tuple[float, int]:
    """Time to the first token of a one-token greedy request, and its cached prompt tokens."""
    params = params_to_proto(SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    request = pb.GenerateRequest(request_id=request_id, prompt_token_ids=prompt, params=params)
    with grpc.insecure_channel(address) as channel:
        stub = executor_pb2_grpc.ExecutorStub(channel)
        started = time.perf_counter()
        cached = 0
        for message in stub.Generate(request, timeout=600):
            cached = max(cached, message.num_cached_tokens)
        return time.perf_counter() - started, cached


def pull_counters(metrics_url: str, series: tuple[str, ...] = PULL_SERIES) -> dict[str, float]:
    """An executor's counters `series` (names without _total), summed over their labels."""
    text = httpx.get(metrics_url, timeout=10).text
    totals = dict.fromkeys(series, 0.0)
    for family in text_string_to_metric_families(text):
        if family.name in totals:
            totals[family.name] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return totals


def copy_gb_per_s(num_bytes: int) -> float:
    """This machine's memory copy bandwidth on `num_bytes` (read + write counted once)."""
    src = torch.empty(num_bytes, dtype=torch.uint8).random_(0, 255)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - started)
    return num_bytes / best / 1e9


def measure(stack: Stack, lengths: list[int], repeats: int, seed: int) -> list[dict[str, Any]]:
    c = stack.config
    source = f"{c.host}:{c.executor_base_port}"
    destination = f"{c.host}:{c.executor_base_port + 1}"
    metrics = f"http://{c.host}:{c.executor_base_metrics_port + 1}/metrics"
    rng = random.Random(seed)

    def context(n: int) -> list[int]:
        return [rng.randrange(10, 40000) for _ in range(n)]

    rows = []
    for step, length in enumerate([lengths[0], *lengths]):  # the first round warms up
        for repeat in range(repeats if step else 1):
            shared, fresh = context(length), context(length)
            first_token_s(source, f"src-{step}-{repeat}", shared)
            before = pull_counters(metrics)
            pulled_s, pulled_cached = first_token_s(
                destination, f"pull-{step}-{repeat}", shared + [5, 6, 7]
            )
            after = pull_counters(metrics)
            computed_s, computed_cached = first_token_s(
                destination, f"compute-{step}-{repeat}", fresh + [5, 6, 7]
            )
            if not step:
                continue
            num_bytes = after[PULL_SERIES[0]] - before[PULL_SERIES[0]]
            transfer_s = after[PULL_SERIES[1]] - before[PULL_SERIES[1]]
            rows.append(
                {
                    "context_tokens": length,
                    "repeat": repeat,
                    "pulled_tokens": pulled_cached,
                    "computed_run_cached_tokens": computed_cached,
                    "ttft_pulled_s": pulled_s,
                    "ttft_computed_s": computed_s,
                    "pulled_bytes": num_bytes,
                    "pull_transfer_s": transfer_s,
                }
            )
            print(
                f"  {length:5d} tokens: pulled {pulled_cached} in {transfer_s * 1e3:.1f} ms "
                f"(TTFT {pulled_s * 1e3:.0f} ms), computed TTFT {computed_s * 1e3:.0f} ms",
                flush=True,
            )
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for length in sorted({r["context_tokens"] for r in rows}):
        runs = [r for r in rows if r["context_tokens"] == length]
        best = min(runs, key=lambda r: r["pull_transfer_s"] or float("inf"))
        computed = min(r["ttft_computed_s"] for r in runs)
        pulled = min(r["ttft_pulled_s"] for r in runs)
        tokens = best["pulled_tokens"] or 1
        gbs = (
            best["pulled_bytes"] / best["pull_transfer_s"] / 1e9
            if best["pull_transfer_s"]
            else None
        )
        out.append(
            {
                "context_tokens": length,
                "pulled_tokens": best["pulled_tokens"],
                "pulled_bytes": best["pulled_bytes"],
                "pull_gb_per_s": gbs,
                "memcpy_gb_per_s": copy_gb_per_s(int(best["pulled_bytes"]) or 1),
                "pull_ms_per_token": best["pull_transfer_s"] * 1e3 / tokens,
                "compute_ms_per_token": computed * 1e3 / length,
                "ttft_pulled_s": pulled,
                "ttft_computed_s": computed,
                "ttft_ratio_pulled_over_computed": pulled / computed,
            }
        )
    return out


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [s["context_tokens"] for s in summary]
    ax.plot(xs, [s["pull_ms_per_token"] for s in summary], "o-", label="pulled from a peer")
    ax.plot(xs, [s["compute_ms_per_token"] for s in summary], "s-", label="computed (prefill)")
    ax.set_xlabel("context tokens")
    ax.set_ylabel("ms per prompt token")
    ax.set_yscale("log")
    ax.set_title("A prefix's KV: pulled vs computed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REPO / "models" / "smollm2-135m-instruct"))
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-kv-blocks", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "pulls.json")
    args = parser.parse_args()
    config = StackConfig(
        model=args.model,
        **stack_ports(2),
        num_executors=2,
        num_kv_blocks=args.num_kv_blocks,
        executor_dtype=args.dtype,
        python=sys.executable,
    )
    print(f"starting a stack: 2 executors, {Path(args.model).name}, {args.dtype}", flush=True)
    with tempfile.TemporaryDirectory() as run_dir:
        stack = Stack(config, Path(run_dir), cwd=REPO)
        try:
            stack.start(timeout_s=300, progress=True)
            rows = measure(stack, sorted(args.lengths), args.repeats, args.seed)
        finally:
            stack.stop()
    summary = summarize(rows)
    print(
        "\ncontext  pulled GB/s  memcpy GB/s  pull ms/token  compute ms/token  TTFT pulled/computed"
    )
    for s in summary:
        print(
            f"{s['context_tokens']:7d}  {fmt(s['pull_gb_per_s'], '.2f'):>11}  "
            f"{fmt(s['memcpy_gb_per_s'], '.1f'):>11}  {fmt(s['pull_ms_per_token'], '.4f'):>13}  "
            f"{fmt(s['compute_ms_per_token'], '.3f'):>16}  "
            f"{fmt(s['ttft_ratio_pulled_over_computed'], '.3f'):>20}"
        )
    results = {
        "machine": machine_info(),
        "model": Path(args.model).name,
        "dtype": args.dtype,
        "runs": rows,
        "summary": summary,
    }
    write_json(args.out, results)
    plot(summary, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
