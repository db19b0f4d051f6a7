"""Paged prefill attention on the CPU: one prompt's causal attention, Quire's C++ kernel beside
torch's scaled_dot_product_attention on the same keys and values laid out densely.

    python -m benchmarks.prefill_attention [--dtypes float32 bfloat16] [--prompt-lens 64 256 1024]
        [--threads N]

A prompt of L tokens attends to itself (causal), as in a prefill step with nothing cached: the
kernel reads its K/V through a shuffled block table, SDPA (`is_causal=True`) gets them dense
with the kv heads repeated for the query heads. The shape is one SmolLM2-135M layer (9 query
heads, 3 kv heads, head_dim 64, 16-slot blocks). GFLOP/s counts the causal half of QK^T and of
PV: 2 * 2 * num_heads * head_dim * L^2 / 2. Each point is the median of repeated calls after a
warm-up; the maximum difference from SDPA's output is printed beside it. Writes
bench/results/prefill_attention.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from quire.kernels import cpp_attention

RESULTS_PATH = Path("bench/results/prefill_attention.json")
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16
TIMED_S = 1.0  # per point and side


def _median_ms(fn: Callable[[], object]) -> float:
    for _ in range(3):
        fn()
    times: list[float] = []
    deadline = time.perf_counter() + TIMED_S
    while len(times) < 5 or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run_point(dtype: torch.dtype, prompt_len: int) -> dict[str, float | int | str]:
    num_blocks = -(-prompt_len // BLOCK_SIZE)
    spare = 8  # blocks the table never names
    query = torch.randn(prompt_len, NUM_HEADS, HEAD_DIM).to(dtype)
    cache_shape = (num_blocks + spare, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    key_cache = torch.randn(cache_shape).to(dtype)
    value_cache = torch.randn(cache_shape).to(dtype)
    blocks = torch.randperm(num_blocks + spare)[:num_blocks]
    block_tables = blocks.to(torch.int32).view(1, num_blocks)
    cu_query_lens = torch.tensor([0, prompt_len], dtype=torch.int32)
    context_lens = torch.tensor([prompt_len], dtype=torch.int32)
    scale = HEAD_DIM**-0.5

    def quire() -> torch.Tensor:
        return torch.ops.quire_cpu.paged_prefill_attention(
            query, key_cache, value_cache, block_tables, cu_query_lens, context_lens, scale,
            None, None, None,
        )  # fmt: skip

    group = NUM_HEADS // NUM_KV_HEADS
    dense = [
        cache[blocks].reshape(-1, NUM_KV_HEADS, HEAD_DIM)[:prompt_len]
        .transpose(0, 1).repeat_interleave(group, 0).unsqueeze(0)
        for cache in (key_cache, value_cache)
    ]  # fmt: skip
    dense_query = query.transpose(0, 1).unsqueeze(0)

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(dense_query, dense[0], dense[1], is_causal=True)

    diff = (quire().float() - sdpa()[0].transpose(0, 1).float()).abs().max().item()
    quire_ms, sdpa_ms = _median_ms(quire), _median_ms(sdpa)
    gflop = 2 * 2 * NUM_HEADS * HEAD_DIM * prompt_len * prompt_len / 2 / 1e9
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "prompt_len": prompt_len,
        "quire_ms": quire_ms,
        "sdpa_ms": sdpa_ms,
        "quire_gflops": gflop / quire_ms * 1e3,
        "sdpa_gflops": gflop / sdpa_ms * 1e3,
        "speedup": sdpa_ms / quire_ms,
        "max_abs_diff": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args()
    reason = cpp_attention.unavailable_reason()
    if reason is not None:
        parser.error(f"the C++ kernels are not loaded: {reason}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"paged prefill attention, {args.threads} threads, variant {cpp_attention.loaded_variant()}"
    )
    print(f"{'dtype':9s} {'L':>5s} {'quire ms':>9s} {'GFLOP/s':>8s} {'sdpa ms':>8s} {'GFLOP/s':>8s}"
          f" {'x':>5s} {'max diff':>9s}")  # fmt: skip
    results = []
    for name in args.dtypes:
        for prompt_len in args.prompt_lens:
            r = run_point(getattr(torch, name), prompt_len)
            results.append(r)
            print(
                f"{r['dtype']:9s} {prompt_len:5d} {r['quire_ms']:9.2f} {r['quire_gflops']:8.0f}"
                f" {r['sdpa_ms']:8.2f} {r['sdpa_gflops']:8.0f} {r['speedup']:5.2f}"
                f" {r['max_abs_diff']:9.1e}"
            )
    report = {
        "benchmark": "prefill_attention",
        "device_name": platform.processor() or "cpu",
        "torch": torch.__version__,
        "threads": args.threads,
        "shape": {
            "num_heads": NUM_HEADS,
            "num_kv_heads": NUM_KV_HEADS,
            "head_dim": HEAD_DIM,
            "block_size": BLOCK_SIZE,
        },
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
