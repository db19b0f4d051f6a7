"""`make bench-preemption`: preemption by swap against preemption by recompute, same requests.

The PagedAttention paper's Figure 19 question on Quire's engine: when the KV pool is too small
for the batch, is it cheaper to copy a preempted sequence's blocks to host memory and back
(`--preemption-mode swap`) or to recompute them (`recompute`)? ShareGPT requests (vLLM's
sampling rule, EOS ignored so every request makes its answer's token count) run through the
offline engine with a pool of a fraction of the blocks the batch would need at its peak, once
per mode and block size (`--repeats` times, the modes' order alternating), each engine warmed
up first. The engine is deterministic, so the repeats differ only in time; on a machine shared
with other work the slow ones are the disturbed ones, and the summary takes each mode's fastest. Per run: output throughput, preemptions,
prefill tokens computed (recomputation shows here), blocks swapped out and in, TTFT, end-to-end
latency of the requests that were preempted, and the stall of a resumed sequence (from the step
that preempted it to its next token). Writes bench/results/preemption.json and preemption.png.

    python -m benchmarks.preemption --help
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.report import pyplot, write_json
from benchmarks.offline.machine import machine_info
from benchmarks.offline.workloads import Workload, build_workload
from quire import LLM, SamplingParams

REPO = Path(__file__).resolve().parents[1]
MODES = ("recompute", "swap")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float | None]:
    return {
        "mean": statistics.fmean(values) if values else None,
        "p50": percentile(values, 0.5),
        "p90": percentile(values, 0.9),
    }


def pool_blocks(workload: Workload, block_size: int, fraction: float) -> int:
    """`fraction` of the blocks every request at full length takes, at least the largest one's."""
    need = [
        -(-(len(p) + o) // block_size)
        for p, o in zip(workload.prompts, workload.output_lens, strict=True)
    ]
    return max(max(need) + 1, int(sum(need) * fraction))


def run_once(
    model: str, workload: Workload, mode: str, block_size: int, num_kv_blocks: int, args: Any
) -> dict[str, Any]:
    """One engine, warmed up, through the whole workload; its figures."""
    llm = LLM(
        model=model,
        dtype=args.dtype,
        block_size=block_size,
        num_kv_blocks=num_kv_blocks,
        max_num_seqs=args.max_num_seqs,
        preemption_mode=mode,
        swap_space=args.swap_space,
    )
    warm = [{"prompt_token_ids": p[:64]} for p in workload.prompts[:4]]
    llm.generate(warm, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    engine = llm.engine
    before = engine.stats()
    ids = [f"r{i}" for i in range(len(workload.prompts))]
    for request_id, prompt, out_len in zip(
        ids, workload.prompts, workload.output_lens, strict=True
    ):
        params = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
        engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
    first_token: dict[str, float] = {}
    finished: dict[str, float] = {}
    stalled_since: dict[str, float] = {}  # preempted, waiting for its next token
    stalls: list[float] = []
    preempted: set[str] = set()
    num_output = num_prefill = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while engine.has_unfinished_requests():
        result = engine.step()
        now = time.perf_counter() - started
        num_prefill += result.stats.num_prefill_tokens
        for delta in result.outputs:
            made = sum(len(o.new_token_ids) for o in delta.outputs)
            num_output += made
            if made:
                first_token.setdefault(delta.request_id, now)
                if delta.request_id in stalled_since:
                    stalls.append(now - stalled_since.pop(delta.request_id))
            if delta.finished:
                finished[delta.request_id] = now
        if result.stats.num_preempted:
            for seq in engine.scheduler.waiting:
                rid = seq.request.request_id
                if seq.request.was_scheduled and rid not in stalled_since:
                    stalled_since[rid] = now
                    preempted.add(rid)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    after = engine.stats()
    assert num_output == workload.num_output_tokens, "every request makes its output length"
    swap_out = after.swap.num_blocks_out - before.swap.num_blocks_out
    swap_in = after.swap.num_blocks_in - before.swap.num_blocks_in
    return {
        "mode": mode,
        "block_size": block_size,
        "num_kv_blocks": num_kv_blocks,
        "wall_s": wall,
        "output_tokens_per_s": num_output / wall,
        "cpu_s": cpu,
        # Steadier than wall time on a machine shared with other work: CPU seconds this process
        # spent (every torch thread's), so other processes' load shows less.
        "output_tokens_per_cpu_s": num_output / cpu,
        "num_preemptions": after.num_preemptions - before.num_preemptions,
        "num_preempted_requests": len(preempted),
        "prefill_tokens_computed": num_prefill,
        "prompt_tokens": workload.num_prompt_tokens,
        "swap_blocks_out": swap_out,
        "swap_blocks_in": swap_in,
        "swap_blocks_missed": after.swap.num_blocks_missed - before.swap.num_blocks_missed,
        "swap_bytes_out": after.swap.num_bytes_out - before.swap.num_bytes_out,
        "swap_bytes_in": after.swap.num_bytes_in - before.swap.num_bytes_in,
        "host_pool_bytes_at_end": after.swap.host_bytes_used,
        "ttft_s": summary(list(first_token.values())),
        "resume_stall_s": summary(stalls),
        "e2e_preempted_s": summary([finished[r] for r in preempted if r in finished]),
        "e2e_all_s": summary(list(finished.values())),
    }


def summarize(runs: list[dict[str, Any]], block_size: int, mode: str) -> dict[str, Any]:
    """One (block size, mode): its fastest repeat, with every repeat's throughput."""
    mine = sorted(
        (r for r in runs if r["block_size"] == block_size and r["mode"] == mode),
        key=lambda r: r["output_tokens_per_s"],
    )
    return {**mine[-1], "repeats_tokens_per_s": [r["output_tokens_per_s"] for r in mine]}


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    sizes = sorted({r["block_size"] for r in runs})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.35
    for k, mode in enumerate(MODES):
        rows = [next(r for r in runs if r["mode"] == mode and r["block_size"] == b) for b in sizes]
        xs = [i + (k - 0.5) * width for i in range(len(sizes))]
        axes[0].bar(xs, [r["output_tokens_per_s"] for r in rows], width, label=mode)
        axes[1].bar(xs, [r["resume_stall_s"]["mean"] or 0.0 for r in rows], width, label=mode)
    for ax, title in zip(
        axes, ("output tok/s", "mean stall of a resumed sequence (s)"), strict=True
    ):
        ax.set_xticks(range(len(sizes)), [f"block {b}" for b in sizes])
        ax.set_title(title)
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns what it wrote to `--out`."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.preemption", description=__doc__)
    parser.add_argument("--model", default=str(REPO / "models" / "smollm2-135m-instruct"))
    parser.add_argument("--num-requests", type=int, default=24)
    parser.add_argument("--max-output-len", type=int, default=256, help="cap each answer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode and block size")
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[16, 32])
    parser.add_argument(
        "--pool-fraction",
        type=float,
        default=0.15,
        help="KV pool as a fraction of the blocks the whole batch takes at full length",
    )
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--swap-space", type=float, default=4.0, help="GiB (swap mode)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch intra-op threads (0: torch's default); 1 keeps OpenMP from spinning, which "
        "makes CPU seconds a steady measure of work on a shared machine",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "preemption.json")
    args = parser.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    llm = LLM(model=args.model, dtype=args.dtype, num_kv_blocks=4)
    workload = build_workload(
        "sharegpt",
        args.num_requests,
        args.seed,
        llm.engine.tokenizer,
        llm.engine.model.config.vocab_size,
        llm.engine.max_model_len,
        max_output_len=args.max_output_len,
    )
    del llm
    runs = []
    machine = machine_info()
    for block_size in args.block_sizes:
        num_kv_blocks = pool_blocks(workload, block_size, args.pool_fraction)
        for repeat in range(args.repeats):
            for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                run = run_once(args.model, workload, mode, block_size, num_kv_blocks, args)
                runs.append(run)
                print(
                    f"block {block_size:3d} {mode:9s} {run['output_tokens_per_s']:7.1f} tok/s "
                    f"({run['output_tokens_per_cpu_s']:6.1f} per CPU s), "
                    f"{run['num_preemptions']} preemptions, {run['prefill_tokens_computed']} "
                    f"prefill tokens, {run['swap_blocks_in']} blocks swapped in, mean stall "
                    f"{run['resume_stall_s']['mean'] or 0:.2f} s",
                    flush=True,
                )
    summaries = [summarize(runs, b, m) for b in args.block_sizes for m in MODES]
    ratios = {}
    for block_size in args.block_sizes:
        by_mode = {r["mode"]: r for r in summaries if r["block_size"] == block_size}
        ratios[str(block_size)] = {
            "throughput_swap_over_recompute": by_mode["swap"]["output_tokens_per_s"]
            / by_mode["recompute"]["output_tokens_per_s"],
            "cpu_throughput_swap_over_recompute": by_mode["swap"]["output_tokens_per_cpu_s"]
            / by_mode["recompute"]["output_tokens_per_cpu_s"],
            "prefill_tokens_swap_over_recompute": by_mode["swap"]["prefill_tokens_computed"]
            / by_mode["recompute"]["prefill_tokens_computed"],
        }
        figures = ", ".join(f"{k} {v:.3f}" for k, v in ratios[str(block_size)].items())
        print(f"block {block_size}: {figures}")
    results = {
        "benchmark": "preemption",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": args.model,
        "num_requests": len(workload.prompts),
        "prompt_tokens": workload.num_prompt_tokens,
        "output_tokens": workload.num_output_tokens,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": {**machine, "load_average_end": list(os.getloadavg())},
        "summary": summaries,
        "runs": runs,
        "ratios": ratios,
    }
    write_json(args.out, results)
    plot(summaries, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return results


if __name__ == "__main__":
    main()
