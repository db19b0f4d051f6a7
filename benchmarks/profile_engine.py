"""Where one offline run's time goes: the engine step's parts and the torch ops inside them.

    python -m benchmarks.profile_engine [--model DIR] [--dtype bfloat16] [--num-requests 64]
        [--memory-manager grpc [--no-quiet-steps]] [--max-num-seqs 256] [--max-prompt-len N]
        [--max-output-len N] [--layer-by-layer]

Runs the engine benchmark's ShareGPT requests (same sampling, greedy, each to its ShareGPT
output length) through `LLM.engine` after a warm-up, and reports:

- the step's parts from every step's `StepStats`: schedule (of which the allocator call),
  forward (copies, inputs, the model), sampling, update, and the loop around them;
- with `--memory-manager grpc`, the blocks come from a real memory manager in a child
  process on a local socket (the executor's RemoteBlockAllocator), so allocator_s is the
  Step round trip; `full_steps` then gives its share of the step time over the steps that
  ran at least 15/16 of --max-num-seqs sequences, and `by_running` per quarter of it;
  steps that needed nothing from the manager make no call (quiet steps, counted in
  `allocator_steps`) unless `--no-quiet-steps`;
- with `--torch-profile`, torch.profiler's operators by self CPU time over the same run
  (the profiler adds overhead: its shares, not its absolute times, are the figures).

JSON goes to bench/results/profile_engine.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from typing import Any

import torch
from tqdm.auto import tqdm

from benchmarks.offline.quire_run import warm_up_quire, warmup_workload
from benchmarks.offline.workloads import build_workload
from benchmarks.step_size import serve
from quire import LLM, SamplingParams
from quire.block.tables import BlockTables
from quire.block.window import TableLayout
from quire.config import EngineConfig
from quire.engine.llm_engine import LLMEngine
from quire.engine.stats import StepStats
from quire.model import linear
from services.executor.remote_allocator import RemoteBlockAllocator

DEFAULT_MODEL = "models/smollm2-135m-instruct"
PARTS = ("schedule_s", "allocator_s", "forward_s", "sample_s", "update_s")


def run(
    engine: LLMEngine, prompts: list[list[int]], output_lens: list[int], full_batch: int = 0
) -> dict[str, Any]:
    """Every request at once, stepped to the end; the parts' totals and the wall time."""
    for i, (prompt, n) in enumerate(zip(prompts, output_lens, strict=True)):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        engine.add_request(f"p{i}", {"prompt_token_ids": prompt}, params)
    totals: Counter[str] = Counter()
    steps: list[StepStats] = []
    start = perf_counter()
    with tqdm(total=sum(output_lens), desc="profile", unit="tok") as bar:
        while engine.has_unfinished_requests():
            result = engine.step()
            steps.append(result.stats)
            bar.update(result.stats.num_sampled)
    wall_s = perf_counter() - start
    for stats in steps:
        for part in PARTS:
            totals[part] += getattr(stats, part)
    in_step = sum(s.total_s for s in steps)
    return {
        "wall_s": wall_s,
        "num_steps": len(steps),
        "num_output_tokens": sum(output_lens),
        "output_tok_s": sum(output_lens) / wall_s,
        "parts_s": dict(totals),
        "parts_share": {part: totals[part] / wall_s for part in PARTS},
        "outside_step_share": (wall_s - in_step) / wall_s,
        "num_decode_tokens": sum(s.num_decode_tokens for s in steps),
        "num_prefill_tokens": sum(s.num_prefill_tokens for s in steps),
        "full_steps": full_steps(steps, full_batch),
        "by_running": by_running(steps, full_batch),
    }


def full_steps(steps: list[StepStats], full_batch: int) -> dict[str, Any] | None:
    """The allocator call's share of the step time over steps running >= 15/16 of the batch."""
    full = [s for s in steps if full_batch and s.num_running >= full_batch * 15 // 16]
    if not full:
        return None
    step_s = sum(s.total_s for s in full)
    return {
        "min_running": full_batch * 15 // 16,
        "num_steps": len(full),
        "mean_running": sum(s.num_running for s in full) / len(full),
        "mean_step_ms": 1000 * step_s / len(full),
        "mean_allocator_ms": 1000 * sum(s.allocator_s for s in full) / len(full),
        "allocator_share": sum(s.allocator_s for s in full) / step_s,
    }


def by_running(steps: list[StepStats], full_batch: int, bins: int = 4) -> list[dict[str, Any]]:
    """The allocator call's share of the step time per quarter of the batch size: steps that
    ran (0, B/4], (B/4, B/2], ... sequences."""
    if not full_batch:
        return []
    rows = []
    for k in range(bins):
        lo, hi = full_batch * k // bins, full_batch * (k + 1) // bins
        group = [s for s in steps if lo < s.num_running <= hi]
        if not group:
            continue
        step_s = sum(s.total_s for s in group)
        rows.append(
            {
                "running": [lo + 1, hi],
                "num_steps": len(group),
                "mean_running": sum(s.num_running for s in group) / len(group),
                "mean_step_ms": 1000 * step_s / len(group),
                "mean_allocator_ms": 1000 * sum(s.allocator_s for s in group) / len(group),
                "allocator_share": sum(s.allocator_s for s in group) / step_s,
            }
        )
    return rows


def remote_engine(
    config: EngineConfig, defer_quiet_steps: bool = True
) -> tuple[LLMEngine, Callable[[], None]]:
    """An engine whose blocks come from a memory manager in a child process (and a closer)."""
    ports: Any = multiprocessing.get_context("spawn").Queue()
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(ports,), daemon=True)
    server.start()
    target = f"127.0.0.1:{ports.get(timeout=60)}"

    def make(num_blocks: int, tables: BlockTables, layout: TableLayout) -> RemoteBlockAllocator:
        return RemoteBlockAllocator(
            target,
            "profile",
            time.time_ns(),
            num_blocks,
            config.block_size,
            config.enable_prefix_caching,
            "",
            tables,
            layout=layout,
            defer_quiet_steps=defer_quiet_steps,
        )

    engine = LLMEngine(config, allocator_factory=make)
    allocator = engine.allocator
    assert isinstance(allocator, RemoteBlockAllocator)
    allocator.register()

    def close() -> None:
        allocator.close()
        server.kill()
        server.join(timeout=10)

    return engine, close


def top_ops(profile: Any, limit: int) -> list[dict[str, Any]]:
    events = profile.key_averages()
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:limit]
    return [
        {
            "op": e.key,
            "calls": e.count,
            "self_cpu_ms": e.self_cpu_time_total / 1000,
            "share": e.self_cpu_time_total / total,
        }
        for e in ranked
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-manager", default="local", choices=["local", "grpc"])
    parser.add_argument(
        "--no-quiet-steps",
        action="store_true",
        help="with --memory-manager grpc: call the manager on every step, quiet ones too",
    )
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-output-len", type=int, default=None, help="cap output lengths")
    parser.add_argument("--max-prompt-len", type=int, default=None, help="cap prompt lengths")
    parser.add_argument("--torch-profile", action="store_true", help="also profile torch ops")
    parser.add_argument("--top", type=int, default=25, help="operators listed")
    parser.add_argument(
        "--layer-by-layer",
        action="store_true",
        help="run every decoder layer kernel by kernel from Python, not as one C++ call "
        "(quire.model.fused_layer), to time what the fused call saves",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/profile_engine.json"))
    args = parser.parse_args(argv)

    llm = LLM(model=args.model, dtype=args.dtype, max_num_seqs=args.max_num_seqs)
    close: Callable[[], None] = lambda: None  # noqa: E731
    if args.memory_manager == "grpc":
        config = llm.engine.config
        del llm.engine  # its KV pool goes before the remote engine allocates one
        llm.engine, close = remote_engine(config, not args.no_quiet_steps)
    engine = llm.engine
    if args.layer_by_layer:
        engine.model.fused_layers = None
    tokenizer = llm.get_tokenizer()
    config = engine.model.config
    workload = build_workload(
        "sharegpt",
        args.num_requests,
        args.seed,
        tokenizer,
        config.vocab_size,
        engine.max_model_len,
        max_prompt_len=args.max_prompt_len,
        max_output_len=args.max_output_len,
    )
    warm_up_quire(llm, warmup_workload(config.vocab_size))
    result: dict[str, Any] = {
        "model": args.model,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "memory_manager": args.memory_manager,
        "layer_by_layer": args.layer_by_layer,
        "quiet_steps": args.memory_manager == "grpc" and not args.no_quiet_steps,
        "max_num_seqs": args.max_num_seqs,
        "num_requests": args.num_requests,
        "max_output_len": args.max_output_len,
        "max_prompt_len": args.max_prompt_len,
        # which linear kernels ran (`auto` is measured at load) and whether each layer was
        # one C++ call: a run's step time depends on both
        "linear_backend": getattr(engine.model, "linear_backend", None),
        "fused_layers": getattr(engine.model, "fused_layers", None) is not None,
        # `auto`'s measurement at load: backend -> mean slowdown against the fastest
        "linear_tuning": {str(k[0]): v for k, v in linear.TUNINGS.items()},
    }
    try:
        if args.torch_profile:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                result["run"] = run(
                    engine, workload.prompts, workload.output_lens, args.max_num_seqs
                )
            result["top_ops"] = top_ops(prof, args.top)
        else:
            result["run"] = run(engine, workload.prompts, workload.output_lens, args.max_num_seqs)
    finally:
        if isinstance(engine.allocator, RemoteBlockAllocator):
            result["allocator_steps"] = {
                "sent": engine.allocator.num_steps,
                "quiet": engine.allocator.num_quiet_steps,
            }
        close()
    print_report(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return result


def print_report(result: dict[str, Any]) -> None:
    r = result["run"]
    print(
        f"linear backend {result['linear_backend']}, "
        f"{'one C++ call a layer' if result['fused_layers'] else 'layer by layer'}, "
        f"tuning {result['linear_tuning']}"
    )
    print(
        f"{result['dtype']}: {r['output_tok_s']:.1f} output tok/s, {r['num_steps']} steps, "
        f"{r['wall_s']:.1f} s"
    )
    for part, share in r["parts_share"].items():
        print(f"  {part:<12} {share:6.1%}  ({r['parts_s'][part]:.2f} s)")
    print(f"  {'outside':<12} {r['outside_step_share']:6.1%}")
    full = r.get("full_steps")
    if full:
        print(
            f"  {full['num_steps']} steps with >= {full['min_running']} running "
            f"(mean {full['mean_running']:.0f}): step {full['mean_step_ms']:.1f} ms, "
            f"allocator {full['mean_allocator_ms']:.2f} ms = {full['allocator_share']:.2%}"
        )
    for row in r.get("by_running", []):
        lo, hi = row["running"]
        print(
            f"  {row['num_steps']:4d} steps with {lo}-{hi} running (mean "
            f"{row['mean_running']:.0f}): step {row['mean_step_ms']:.1f} ms, allocator "
            f"{row['mean_allocator_ms']:.2f} ms = {row['allocator_share']:.2%}"
        )
    if "allocator_steps" in result:
        calls = result["allocator_steps"]
        print(f"  memory-manager calls: {calls['sent']} sent, {calls['quiet']} quiet steps")
    for op in result.get("top_ops", []):
        print(f"  {op['share']:6.1%}  {op['self_cpu_ms']:9.1f} ms  {op['calls']:7d}  {op['op']}")


if __name__ == "__main__":
    main()
