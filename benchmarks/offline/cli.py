"""The offline benchmark's command line."""

from __future__ import annotations

import argparse
from pathlib import Path

import benchmarks.offline
from benchmarks.offline.config import (
    DEFAULT_MODEL,
    DTYPES,
    HF_BATCH_SIZE,
    QUICK,
    WINDOW_BUDGET_BLOCKS,
)
from benchmarks.offline.workloads import DEFAULT_NUM_REQUESTS, WORKLOAD_NAMES


def parse_num_requests(items: list[str], names: list[str], quick: bool) -> dict[str, int]:
    """Requests per workload from N (all) or NAME=N items over the defaults."""
    counts = {n: QUICK["num_requests"] if quick else DEFAULT_NUM_REQUESTS[n] for n in names}
    for item in items:
        name, _, value = item.rpartition("=")
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"--num-requests: expected N or NAME=N with N >= 1, got {item!r}")
        if not name:
            counts = dict.fromkeys(counts, int(value))
        elif name in counts:
            counts[name] = int(value)
        else:
            raise SystemExit(f"--num-requests: unknown workload {name!r}")
    return counts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The benchmark's options, with --quick's settings applied."""
    parser = argparse.ArgumentParser(description=benchmarks.offline.__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help=f"checkpoint dir (default {DEFAULT_MODEL})")
    parser.add_argument(
        "--workloads", nargs="+", choices=WORKLOAD_NAMES, default=["sharegpt"], help="(sharegpt)"
    )
    parser.add_argument(
        "--data", type=Path, default=None, help="ShareGPT JSON (default data/sharegpt/...)"
    )
    parser.add_argument(
        "--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES), help="(float32 bfloat16)"
    )
    parser.add_argument(
        "--hf-dtypes",
        nargs="*",
        choices=DTYPES,
        default=["float32"],
        help="dtypes the transformers baselines run in (float32; none with --skip-hf)",
    )
    parser.add_argument(
        "--num-requests",
        nargs="*",
        default=[],
        metavar="N|NAME=N",
        help="requests per workload (default "
        + ", ".join(f"{n}={c}" for n, c in DEFAULT_NUM_REQUESTS.items())
        + ")",
    )
    parser.add_argument(
        "--hf-batch-size", type=int, default=HF_BATCH_SIZE, help=f"static batch ({HF_BATCH_SIZE})"
    )
    parser.add_argument(
        "--window-budget-blocks",
        type=int,
        default=WINDOW_BUDGET_BLOCKS,
        help="KV budget of the window run, freeing blocks outside the sliding window vs "
        f"keeping them (only a model whose every layer slides; {WINDOW_BUDGET_BLOCKS})",
    )
    parser.add_argument("--skip-hf", action="store_true", help="no transformers baselines")
    parser.add_argument("--skip-vllm", action="store_true", help="no vLLM baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for every system (default: torch's own, all cores; 1 with --quick)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="output dir")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: quire-tiny, 4 ShareGPT requests cut short, float32, no vLLM",
    )
    args = parser.parse_args(argv)
    if args.hf_batch_size < 1:
        parser.error("--hf-batch-size must be >= 1")
    if args.window_budget_blocks < 1:
        parser.error("--window-budget-blocks must be >= 1")
    if args.quick:
        args.model = args.model or QUICK["model"]
        args.threads = args.threads or QUICK["threads"]
        args.dtypes = ["float32"] if argv is None or "--dtypes" not in argv else args.dtypes
        args.skip_vllm = True
    args.model = args.model or DEFAULT_MODEL
    if args.skip_hf:
        args.hf_dtypes = []
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    return args
