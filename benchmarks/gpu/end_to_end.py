"""Offline throughput on one device: Quire's engine against transformers, same model, same requests.

    python -m benchmarks.gpu.end_to_end --kit .gpu-kit [--device cuda] [--dtype bfloat16]

The model is the kit's (benchmarks.gpu.kit): SmolLM2-135M's config and tokenizer with seeded
random weights, written once as a checkpoint both systems load. The requests are the kit's
ShareGPT requests, each run to its ShareGPT output length with EOS ignored, greedy. Each system
is warmed up first (the offline benchmark's warm-up prompts), then timed on the same requests:
Quire through `LLM.engine` stepped to completion (benchmarks.offline.quire_run), transformers'
`generate()` on arrival-order batches and its continuous batching (benchmarks.offline.hf).
Prints the table and writes JSON (default bench/results/gpu/end_to_end.json).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.report import fmt, write_json
from benchmarks.gpu.kit import DEFAULT_KIT, build_checkpoint, read_kit
from benchmarks.offline.hf import (
    HFRun,
    load_hf_model,
    run_hf_continuous,
    run_hf_static,
    warm_up_hf_static,
)
from benchmarks.offline.machine import machine_info
from benchmarks.offline.quire_run import run_quire, warm_up_quire, warmup_workload
from benchmarks.offline.workloads import Workload, capped

RESULTS_PATH = Path("bench/results/gpu/end_to_end.json")
CLEANUP_S = 15  # kept back from --time-limit-s for writing the report and exiting
MIN_CONTINUOUS_S = 20  # less left than this: transformers' continuous batching is not started


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kit", type=Path, default=DEFAULT_KIT, help="the GPU kit's directory")
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu"
    )
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--num-requests", type=int, default=256, help="the kit's first N")
    parser.add_argument("--max-prompt-len", type=int, help="cut prompts to their last N tokens")
    parser.add_argument("--max-output-len", type=int, help="cap every output length")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="Quire's running cap")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=8192, help="Quire's tokens per step"
    )
    parser.add_argument("--hf-batch-size", type=int, default=64, help="generate()'s batch size")
    parser.add_argument(
        "--hf-continuous-timeout-s",
        type=float,
        default=180,
        help="stop transformers' continuous batching after this long (reported as an error)",
    )
    parser.add_argument("--skip-hf-continuous", action="store_true")
    parser.add_argument(
        "--time-limit-s",
        type=float,
        help="this run's whole time: continuous batching's timeout shrinks to fit in it",
    )
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    parser.add_argument("--output", type=Path, default=RESULTS_PATH, help="JSON results path")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device} but torch.cuda.is_available() is False")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both systems on the kit's requests; the report is rewritten to --output after each one,
    so a run stopped from outside still leaves what it measured."""
    started = time.monotonic()
    kit = read_kit(args.kit)
    if args.num_requests > len(kit.prompts):
        raise ValueError(
            f"the kit holds {len(kit.prompts)} requests, {args.num_requests} asked for"
        )
    pairs = list(zip(kit.prompts, kit.output_lens, strict=True))[: args.num_requests]
    workload: Workload = capped("sharegpt", pairs, args.max_prompt_len, args.max_output_len)
    device = torch.device(args.device)
    machine = {**machine_info(), "triton": _triton_version()}
    report: dict[str, Any] = {
        "benchmark": "gpu_end_to_end",
        "device": args.device,
        "device_name": (
            torch.cuda.get_device_name(device) if device.type == "cuda" else machine["cpu"]
        ),
        "machine": machine,
        "model": f"{kit.model_name} (config and tokenizer; random weights, seed {args.seed})",
        "dtype": args.dtype,
        "workload": {
            "name": "sharegpt",
            "seed": kit.seed,
            "num_requests": len(workload.prompts),
            "num_prompt_tokens": workload.num_prompt_tokens,
            "num_output_tokens": workload.num_output_tokens,
        },
        "quire": None,
        "transformers": {},
    }
    with tempfile.TemporaryDirectory(prefix="quire-gpu-model-") as model_dir:
        build_checkpoint(kit, Path(model_dir), args.dtype, args.seed)
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(model_dir)
        vocab_size = hf_config.vocab_size
        pad_id = hf_config.pad_token_id if hf_config.pad_token_id is not None else 0
        warmup = warmup_workload(vocab_size)

        from quire import LLM

        llm = LLM(
            model=model_dir,
            dtype=args.dtype,
            device=args.device,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
        )
        warm_up_quire(llm, warmup)
        quire = run_quire(llm, workload, f"quire {args.dtype}")
        quire_tok_s = quire.num_output_tokens / quire.wall_s
        quire_kv_tokens = llm.engine.allocator.num_blocks * llm.engine.allocator.block_size
        report["quire"] = {
            "wall_s": quire.wall_s,
            "output_tok_s": quire_tok_s,
            "num_steps": quire.num_steps,
            "num_preemptions": quire.num_preemptions,
            "num_kv_blocks": llm.engine.allocator.num_blocks,
            "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "peak_device_memory_mib": None,
        }
        del llm
        gc.collect()
        report["quire"]["peak_device_memory_mib"] = _peak_memory_mib(device)
        write_json(args.output, report)

        hf = load_hf_model(model_dir, getattr(torch, args.dtype)).to(device)
        warm_up_hf_static(hf, vocab_size, pad_id)
        static = run_hf_static(hf, workload, args.hf_batch_size, pad_id)
        report["transformers"]["transformers static"] = _hf_entry(static, quire_tok_s)
        write_json(args.output, report)
        if not args.skip_hf_continuous:
            gc.collect()
            timeout_s = args.hf_continuous_timeout_s
            if args.time_limit_s is not None:
                left_s = args.time_limit_s - (time.monotonic() - started) - CLEANUP_S
                timeout_s = min(timeout_s, left_s)
            if timeout_s < MIN_CONTINUOUS_S:
                continuous = HFRun(error=f"skipped: {timeout_s:.0f} s left of --time-limit-s")
            else:
                continuous = run_hf_continuous(
                    hf,
                    workload,
                    num_kv_tokens=quire_kv_tokens,  # the same KV capacity as Quire's pool
                    max_batch_tokens=args.max_num_batched_tokens,
                    max_num_seqs=args.max_num_seqs,
                    timeout_s=timeout_s,
                )
            report["transformers"]["transformers continuous"] = _hf_entry(continuous, quire_tok_s)
        del hf
        gc.collect()
    return report


def _hf_entry(run: HFRun, quire_tok_s: float) -> dict[str, Any]:
    return {
        "wall_s": run.wall_s,
        "output_tok_s": run.tok_s,
        "error": run.error,
        "details": run.details,
        "quire_ratio": None if run.tok_s is None else quire_tok_s / run.tok_s,
    }


def _peak_memory_mib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated(device) / 2**20
    torch.cuda.reset_peak_memory_stats(device)
    return peak


def _triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "not installed"
    return str(triton.__version__)


def print_table(report: dict[str, Any]) -> None:
    workload = report["workload"]
    print(
        f"{report['device_name']}, {report['dtype']}, {report['model']}: "
        f"{workload['num_requests']} ShareGPT requests, {workload['num_prompt_tokens']:,} prompt "
        f"+ {workload['num_output_tokens']:,} output tokens"
    )
    print(f"{'system':<26} {'wall s':>8} {'output tok/s':>13} {'Quire / it':>11}")
    quire = report["quire"]
    print(f"{'quire':<26} {quire['wall_s']:>8.1f} {quire['output_tok_s']:>13.1f} {'':>11}")
    for name, run in report["transformers"].items():
        ratio = fmt(run["quire_ratio"], ".2f") + ("x" if run["quire_ratio"] else "")
        print(
            f"{name:<26} {fmt(run['wall_s']):>8} {fmt(run['output_tok_s']):>13} {ratio:>11}"
            + (f"  ({run['error']})" if run["error"] else "")
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report = run(args)
    print_table(report)
    write_json(args.output, report)
    print(f"wrote {args.output}")
    return report


if __name__ == "__main__":
    main()
