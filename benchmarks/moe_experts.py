"""A mixture-of-experts layer's experts: the grouped path against the per-expert loop on the
same routed tokens, tokens/s.

    python -m benchmarks.moe_experts [--device cpu|cuda] [--dtypes float32 bfloat16] [--quick]

Paths (quire.kernels): "loop" (reference_experts: one GEMM pair per expert the batch uses, a
Python loop over them), "grouped" (grouped_experts: two grouped GEMMs over every expert's sorted
rows, no loop) and, on CUDA, "triton" (triton_experts). Shapes: a Mixtral-like layer (8
experts, top-2) and a Qwen3-MoE-like one (128 experts, top-8), each scaled down so its weights
fit beside other work on a small machine (the figures name them); token counts from decode
batches to a prefill chunk. Each point runs the paths interleaved, `--repeats` rounds, and
keeps each path's best (the machine is shared: a round another process interrupts is slower,
never faster) beside its median; tokens/s and the ratio to the loop come from the best times of
the same run. Each round's process CPU time is kept too (tokens per CPU second): on a machine
other work keeps busy it moves far less than wall time does. Router weights are
top-k softmax probabilities of random logits, renormalized. Writes
bench/results/moe_experts.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.report import pyplot
from quire.kernels import grouped_experts, reference_experts
from quire.model.moe import route

RESULTS_PATH = Path("bench/results/moe_experts.json")
ExpertMlp = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class LayerShape:
    """One sparse layer's experts."""

    name: str
    hidden: int
    intermediate: int  # each expert's
    num_experts: int
    top_k: int


SHAPES = (
    LayerShape("mixtral-like (hidden 1024, inter 3584, 8 experts, top-2)", 1024, 3584, 8, 2),
    LayerShape("qwen3-moe-like (hidden 1024, inter 384, 128 experts, top-8)", 1024, 384, 128, 8),
)
QUICK_SHAPES = (LayerShape("tiny (hidden 64, inter 96, 8 experts, top-2)", 64, 96, 8, 2),)
TOKEN_COUNTS = (1, 4, 16, 64, 512)


def paths(device: str) -> dict[str, ExpertMlp]:
    found: dict[str, ExpertMlp] = {
        "loop": reference_experts.expert_mlp,
        "grouped": grouped_experts.expert_mlp,
    }
    if device == "cuda":
        from quire.kernels import triton_experts

        found["triton"] = triton_experts.expert_mlp
    return found


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(
    shape: LayerShape, num_tokens: int, dtype: torch.dtype, device: str, repeats: int
) -> list[dict[str, Any]]:
    """Every path's best and median seconds over `repeats` interleaved rounds at one point."""
    gen = torch.Generator().manual_seed(num_tokens)
    e, h, i = shape.num_experts, shape.hidden, shape.intermediate
    gate_up_t = (torch.randn(e, h, 2 * i, generator=gen) * h**-0.5).to(device, dtype)
    down_t = (torch.randn(e, i, h, generator=gen) * i**-0.5).to(device, dtype)
    x = torch.randn(num_tokens, h, generator=gen).to(device, dtype)
    experts, weights = route(
        torch.randn(num_tokens, e, generator=gen).to(device), shape.top_k, True
    )
    fns = paths(device)
    seconds: dict[str, list[float]] = {name: [] for name in fns}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in fns}
    with torch.inference_mode():
        for repeat in range(repeats + 1):  # the first round warms up, untimed
            for name, fn in fns.items():
                _sync(device)
                started, cpu_started = time.perf_counter(), time.process_time()
                fn(x, gate_up_t, down_t, experts, weights)
                _sync(device)
                if repeat:
                    seconds[name].append(time.perf_counter() - started)
                    cpu_seconds[name].append(time.process_time() - cpu_started)
    loop_s, loop_cpu_s = min(seconds["loop"]), min(cpu_seconds["loop"])
    rows = []
    for name, times in seconds.items():
        best, best_cpu = min(times), min(cpu_seconds[name])
        rows.append(
            {
                "shape": shape.name,
                **{k: v for k, v in asdict(shape).items() if k != "name"},
                "dtype": str(dtype).removeprefix("torch."),
                "num_tokens": num_tokens,
                "path": name,
                "best_ms": best * 1e3,
                "median_ms": statistics.median(times) * 1e3,
                "max_ms": max(times) * 1e3,
                "tokens_per_s": num_tokens / best,
                "speedup_over_loop": loop_s / best,
                "best_cpu_ms": best_cpu * 1e3,
                "tokens_per_cpu_s": num_tokens / best_cpu,
                "cpu_speedup_over_loop": loop_cpu_s / best_cpu,
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'shape':<62} {'dtype':<9} {'tokens':>6} {'path':<8} {'best ms':>9} {'tok/s':>10} "
        f"{'x loop':>7} {'cpu ms':>9} {'x loop':>7}"
    )
    for r in rows:
        print(
            f"{r['shape']:<62} {r['dtype']:<9} {r['num_tokens']:>6} {r['path']:<8} "
            f"{r['best_ms']:>9.2f} {r['tokens_per_s']:>10.0f} {r['speedup_over_loop']:>7.2f} "
            f"{r['best_cpu_ms']:>9.2f} {r['cpu_speedup_over_loop']:>7.2f}"
        )


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    panels = sorted({(r["shape"], r["dtype"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (shape, dtype) in zip(axes[0], panels, strict=True):
        for name in dict.fromkeys(r["path"] for r in rows):
            mine = [r for r in rows if (r["shape"], r["dtype"], r["path"]) == (shape, dtype, name)]
            ax.plot(
                [r["num_tokens"] for r in mine], [r["tokens_per_s"] for r in mine], "o-", label=name
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{shape.split(' (')[0]}, {dtype}", fontsize=9)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the sweep; returns what it wrote to `--output`."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.moe_experts", description=__doc__)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--token-counts", type=int, nargs="+", default=list(TOKEN_COUNTS))
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per point")
    parser.add_argument("--quick", action="store_true", help="one tiny shape (plumbing)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's own)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = list(os.getloadavg())
    rows: list[dict[str, Any]] = []
    for shape in QUICK_SHAPES if args.quick else SHAPES:
        for dtype in args.dtypes:
            for num_tokens in args.token_counts:
                rows += measure(shape, num_tokens, getattr(torch, dtype), args.device, args.repeats)
    print_table(rows)
    report = {
        "benchmark": "moe_experts",
        "device": args.device,
        "machine": platform.processor() or platform.machine(),
        "num_cpus": os.cpu_count(),
        "num_threads": torch.get_num_threads(),
        "load_average_start": load_before,
        "load_average_end": list(os.getloadavg()),
        "date": time.strftime("%Y-%m-%d"),
        "results": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    plot(rows, args.output.with_suffix(".png"))
    print(f"wrote {args.output} and {args.output.with_suffix('.png')}")
    return report


if __name__ == "__main__":
    main()
