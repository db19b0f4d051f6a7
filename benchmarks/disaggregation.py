"""`make bench-disagg`: prefill/decode roles against two executors that take both phases.

The same ShareGPT requests (vLLM's sampling rule, greedy, ignore_eos, outputs capped at
`--max-output-len`) go through a real stack of two executors twice per concurrency level:
once with both executors `--role both` (the default) and once with executor-0 `--role prefill`
and executor-1 `--role decode`, where every output's first token comes from executor-0 and the
rest from executor-1, which pulls the prompt's blocks. Each executor runs one torch thread,
pinned to its own core, so the two topologies share the machine the same way. A closed loop of
`c` clients keeps c requests in flight. Per topology and level: output tokens/s, TTFT and TPOT
(time per output token after the first) p50 and p99, and the ratios disaggregated / both.

What to expect (vLLM's documentation says it too): splitting the phases does not add
throughput (one executor of two now only prefills), but a decode step never waits behind
another request's prefill, so TPOT tails can shrink while TTFT grows. The run says by how much
on this machine. Writes bench/results/disaggregation.json and .png.

    python -m benchmarks.disaggregation --help
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common.report import pyplot, write_json
from benchmarks.common.sse import StreamRecord
from benchmarks.common.sse_client import stream
from benchmarks.common.workload import sample_sharegpt
from benchmarks.offline.machine import machine_info
from services.stack.ports import stack_ports
from services.stack.runner import Stack
from services.stack.spec import StackConfig

REPO = Path(__file__).resolve().parents[1]
TOPOLOGIES = {"both": "", "prefill-decode": "prefill,decode"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.disaggregation", description=__doc__)
    p.add_argument("--model", default=str(REPO / "models" / "smollm2-135m-instruct"))
    p.add_argument(
        "--data",
        default=str(REPO / "data" / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json"),
    )
    p.add_argument("--dtype", default="float32", help="the executors' dtype (pinned)")
    p.add_argument("--requests", type=int, default=32, help="requests per level and topology")
    p.add_argument("--concurrency", default="1,8", help="levels, comma separated")
    p.add_argument("--max-input-len", type=int, default=1024, help="prompts cut to this")
    p.add_argument("--max-output-len", type=int, default=64, help="outputs cut to this")
    p.add_argument("--num-kv-blocks", type=int, default=1024)
    p.add_argument(
        "--topologies", default=",".join(TOPOLOGIES), help="which of both, prefill-decode"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "disaggregation.json")
    return p.parse_args(argv)


def requests(args: argparse.Namespace) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) of the first ShareGPT requests of the seed."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    out = []
    for r in sample_sharegpt(args.data, tokenizer, args.requests, args.seed):
        ids = list(r.prompt_token_ids)[: args.max_input_len]
        out.append((ids, max(2, min(r.output_len, args.max_output_len))))
    return out


async def closed_loop(
    url: str, model: str, work: list[tuple[list[int], int]], concurrency: int
) -> tuple[list[StreamRecord], float]:
    """Every request, `concurrency` in flight at a time; the records and the wall seconds."""
    queue = list(reversed(work))
    records: list[StreamRecord] = []

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            prompt, output_len = queue.pop()
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": output_len,
                "temperature": 0.0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            records.append(await stream(http, url, body, deadline_s=600))

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=None) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return records, time.perf_counter() - start


def summarize(records: list[StreamRecord], wall_s: float) -> dict[str, Any]:
    failed = [r for r in records if r.error]
    ok = [r for r in records if not r.error and r.ttft is not None and r.end is not None]
    out_tokens = sum(r.usage.completion_tokens for r in ok if r.usage is not None)
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = []
    for r in ok:
        n = r.usage.completion_tokens if r.usage is not None else 0
        if n > 1 and r.ttft is not None and r.end is not None:
            tpot.append((r.end - r.start - r.ttft) / (n - 1))

    def pct(xs: list[float], q: float) -> float | None:
        return float(np.percentile(xs, q)) * 1000 if xs else None

    return {
        "num_requests": len(records),
        "num_failed": len(failed),
        "errors": sorted({r.error for r in failed})[:5],
        "output_tok_s": out_tokens / wall_s if wall_s else 0.0,
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p99_ms": pct(ttft, 99),
        "tpot_p50_ms": pct(tpot, 50),
        "tpot_p99_ms": pct(tpot, 99),
        "wall_s": wall_s,
    }


def run_topology(
    args: argparse.Namespace, roles: str, levels: list[int], work: list[tuple[list[int], int]]
) -> dict[str, Any]:
    config = StackConfig(
        model=args.model,
        **stack_ports(2),
        num_executors=2,
        num_kv_blocks=args.num_kv_blocks,
        executor_dtype=args.dtype,
        executor_torch_threads=1,
        pin_executors=True,
        executor_roles=roles,
        python=sys.executable,
    )
    url = f"{config.router_url}/v1/completions"
    model = Path(args.model).name
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as run_dir:
        stack = Stack(config, Path(run_dir), cwd=REPO)
        try:
            stack.start(timeout_s=300, progress=True)
            asyncio.run(closed_loop(url, model, work[:2], 2))  # warm-up, both executors
            for c in levels:
                records, wall_s = asyncio.run(closed_loop(url, model, work, c))
                results[str(c)] = summarize(records, wall_s)
                s = results[str(c)]
                print(
                    f"[{roles or 'both,both':15s}] concurrency {c:3d}: "
                    f"{s['output_tok_s']:7.1f} tok/s  TTFT p50 {s['ttft_p50_ms']:8.0f} ms "
                    f"p99 {s['ttft_p99_ms']:8.0f} ms  TPOT p50 {s['tpot_p50_ms']:6.1f} ms "
                    f"p99 {s['tpot_p99_ms']:6.1f} ms  failed {s['num_failed']} {s['errors']}",
                    flush=True,
                )
        finally:
            stack.stop()
    return results


def ratios(both: dict[str, Any], split: dict[str, Any]) -> dict[str, Any]:
    """Disaggregated / both, per level and figure."""
    out: dict[str, Any] = {}
    for level, b in both.items():
        s = split[level]
        out[level] = {
            key: (s[key] / b[key]) if b.get(key) and s.get(key) is not None else None
            for key in ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")
        }
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for name, by_level in results["topologies"].items():
        levels = sorted(by_level, key=int)
        xs = [int(c) for c in levels]
        axes[0].plot(xs, [by_level[c]["output_tok_s"] for c in levels], marker="o", label=name)
        axes[1].plot(xs, [by_level[c]["ttft_p50_ms"] for c in levels], marker="o", label=name)
        axes[2].plot(xs, [by_level[c]["tpot_p99_ms"] for c in levels], marker="o", label=name)
    for ax, title in zip(axes, ("output tok/s", "TTFT p50 (ms)", "TPOT p99 (ms)"), strict=True):
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.set_xscale("log", base=2)
        ax.legend()
    fig.suptitle(f"prefill/decode roles vs both, {results['model']} {results['dtype']}")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c]
    work = requests(args)
    print(
        f"{len(work)} ShareGPT requests, {sum(len(p) for p, _ in work)} prompt tokens, "
        f"{sum(o for _, o in work)} output tokens; levels {levels}",
        flush=True,
    )
    results: dict[str, Any] = {
        "machine": machine_info(),
        "model": Path(args.model).name,
        "dtype": args.dtype,
        "requests": len(work),
        "topologies": {},
    }
    for name in [t for t in args.topologies.split(",") if t]:
        results["topologies"][name] = run_topology(args, TOPOLOGIES[name], levels, work)
        write_json(args.out, results)
    if len(results["topologies"]) == len(TOPOLOGIES):
        results["ratios"] = ratios(
            results["topologies"]["both"], results["topologies"]["prefill-decode"]
        )
    for level, r in results.get("ratios", {}).items():
        shown = "  ".join(f"{k} {v:.2f}" for k, v in r.items() if v is not None)
        print(f"prefill-decode / both at concurrency {level}: {shown}", flush=True)
    write_json(args.out, results)
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
