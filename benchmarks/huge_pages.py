"""Weights and KV blocks in transparent huge pages against 4 KiB pages: a lone request's decode
step, offline, with EngineConfig.huge_pages on and off, and the raw rate a stream of reads gets
from each kind of page.

    python -m benchmarks.huge_pages [--model PATH] [--dtypes float32,bfloat16] [--rounds 3]

Each round runs one process per setting, alternating (off, on), so a machine whose speed drifts
drifts for both; the figure per setting is the median over rounds of each process's median
decode step. A process loads the model, warms up, then decodes `--requests` lone requests of
`--prompt-len` prompt tokens and `--output-len` greedy tokens each (the same token ids in every
process), one at a time, and records the engine step's wall time. The read rate: a 256 MiB
float32 tensor summed by torch's threads, in plain memory and in an arena advised huge (the
best of 20 passes each). Writes bench/results/huge_pages.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.offline.machine import machine_info

RESULTS_PATH = Path("bench/results/huge_pages.json")
READ_BYTES = 256 << 20


def read_rate(huge: bool) -> float:
    """GB/s of the best of 20 sums over a 256 MiB float32 tensor."""
    import torch

    from quire.model import huge_pages

    if huge:
        data = huge_pages.empty_bytes(READ_BYTES).view(torch.float32)
    else:
        data = torch.empty(READ_BYTES // 4, dtype=torch.float32)
    data.fill_(1.0)
    best = float("inf")
    for _ in range(20):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return READ_BYTES / best / 1e9


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One process: the model under one setting, its lone decode steps timed."""
    from quire import LLM, SamplingParams

    huge = args.huge_pages == "on"
    llm = LLM(model=args.model, dtype=args.dtype, huge_pages=huge)
    engine = llm.engine
    vocab = engine.model.config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    steps: list[float] = []
    prefills: list[float] = []
    for request in range(args.requests + 1):  # the first warms up
        prompt = [
            (7919 * (request * args.prompt_len + i)) % (vocab - 3) + 3
            for i in range(args.prompt_len)
        ]
        engine.add_request(f"r{request}", {"prompt_token_ids": prompt}, params)
        first = True
        while engine.has_unfinished_requests():
            start = time.perf_counter()
            engine.step()
            elapsed = time.perf_counter() - start
            if request > 0:
                (prefills if first else steps).append(elapsed)
            first = False
    with open(f"/proc/{os.getpid()}/smaps_rollup") as rollup:
        anon_huge_kib = next(
            (int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:")), 0
        )
    return {
        "decode_step_ms": statistics.median(steps) * 1e3,
        "prefill_ms": statistics.median(prefills) * 1e3,
        "anon_huge_pages_mib": anon_huge_kib / 1024,
        "read_gb_per_s": read_rate(huge),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=600)
    parser.add_argument("--output-len", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--huge-pages", choices=("on", "off"), default="on", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    machine_before = machine_info()
    results: dict[str, Any] = {
        "benchmark": "huge_pages",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": args.model,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    for dtype in args.dtypes.split(","):
        runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        for round_ in range(args.rounds):
            for setting in ("off", "on"):
                command = [
                    sys.executable, "-m", "benchmarks.huge_pages", "--worker",
                    "--model", args.model, "--dtype", dtype, "--huge-pages", setting,
                    "--requests", str(args.requests), "--prompt-len", str(args.prompt_len),
                    "--output-len", str(args.output_len),
                ]  # fmt: skip
                out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                run = json.loads(out.strip().splitlines()[-1])
                runs[setting].append(run)
                print(
                    f"{dtype} round {round_ + 1}/{args.rounds} huge pages {setting}: decode step "
                    f"{run['decode_step_ms']:.2f} ms, prefill {run['prefill_ms']:.1f} ms, "
                    f"read {run['read_gb_per_s']:.1f} GB/s, "
                    f"{run['anon_huge_pages_mib']:.0f} MiB in huge pages",
                    flush=True,
                )

        def median(setting: str, key: str) -> float:
            return statistics.median(run[key] for run in runs[setting])  # noqa: B023

        summary = {
            setting: {
                key: median(setting, key)
                for key in ("decode_step_ms", "prefill_ms", "read_gb_per_s")
            }
            for setting in ("off", "on")
        }
        summary["decode_speedup"] = (
            summary["off"]["decode_step_ms"] / summary["on"]["decode_step_ms"]
        )
        summary["prefill_speedup"] = summary["off"]["prefill_ms"] / summary["on"]["prefill_ms"]
        summary["read_speedup"] = summary["on"]["read_gb_per_s"] / summary["off"]["read_gb_per_s"]
        results[dtype] = {"summary": summary, "runs": runs}
        print(
            f"{dtype}: decode step {summary['off']['decode_step_ms']:.2f} -> "
            f"{summary['on']['decode_step_ms']:.2f} ms ({summary['decode_speedup']:.2f}x), "
            f"prefill {summary['off']['prefill_ms']:.1f} -> {summary['on']['prefill_ms']:.1f} ms "
            f"({summary['prefill_speedup']:.2f}x), reads {summary['off']['read_gb_per_s']:.1f} -> "
            f"{summary['on']['read_gb_per_s']:.1f} GB/s ({summary['read_speedup']:.2f}x)",
            flush=True,
        )
    results["machine"] = {**machine_before, "load_average_end": list(os.getloadavg())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
