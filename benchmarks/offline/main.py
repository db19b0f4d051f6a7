"""The offline benchmark's run: every workload through Quire, vLLM and transformers, per dtype."""

from __future__ import annotations

import gc
import math
import os
from typing import Any

import torch

from benchmarks.common.report import write_json
from benchmarks.common.stats import length_stats, ratio
from benchmarks.offline.cli import parse_args, parse_num_requests
from benchmarks.offline.concurrency import run_concurrency
from benchmarks.offline.config import (
    BLOCK_SIZE,
    CONCURRENCY_BUDGET_CONTEXTS,
    CONCURRENCY_CONTEXT,
    CONCURRENCY_DEMAND,
    DEFINITIONS,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    QUICK,
)
from benchmarks.offline.hf import (
    HFRun,
    load_hf_model,
    run_hf_continuous,
    run_hf_static,
    warm_up_hf_static,
)
from benchmarks.offline.machine import (
    machine_info,
    matmul_flops,
    matmul_size,
    peak_rss_mib,
    reset_peak_rss,
)
from benchmarks.offline.plot import draw
from benchmarks.offline.quire_run import run_quire, warm_up_quire, warmup_workload
from benchmarks.offline.table import print_table
from benchmarks.offline.utilization import kv_summary, quire_flops
from benchmarks.offline.vllm import VLLMRun, run_vllm
from benchmarks.offline.window import freeable_window, run_window_freeing
from benchmarks.offline.workloads import build_workload
from quire import LLM
from quire.cache.paged_kv import kv_bytes_per_token


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; write engine.json and engine.png, print the table; the results."""
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from transformers import AutoConfig, AutoTokenizer

    hf_config = AutoConfig.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    vocab_size = hf_config.vocab_size
    context_len = hf_config.max_position_embeddings
    pad_id = hf_config.pad_token_id if hf_config.pad_token_id is not None else 0
    counts = parse_num_requests(args.num_requests, args.workloads, args.quick)
    caps = {
        "max_prompt_len": QUICK["max_prompt_len"] if args.quick else None,
        "max_output_len": QUICK["max_output_len"] if args.quick else None,
    }
    data = {"data_path": args.data} if args.data else {}
    budget_contexts = QUICK["budget_contexts"] if args.quick else CONCURRENCY_BUDGET_CONTEXTS
    budget_context = min(context_len, CONCURRENCY_CONTEXT)
    budget_blocks = budget_contexts * -(-budget_context // BLOCK_SIZE)
    num_kv_blocks = QUICK["num_kv_blocks"] if args.quick else None  # None: Quire's default
    warmup = warmup_workload(vocab_size)
    window = freeable_window(args.model)

    machine = machine_info()
    dtypes = {d: getattr(torch, d) for d in dict.fromkeys([*args.dtypes, *args.hf_dtypes])}
    peaks_start = {d: matmul_flops(t) for d, t in dtypes.items()}
    workloads = {
        name: build_workload(
            name, counts[name], args.seed, tokenizer, vocab_size, context_len, **data, **caps
        )
        for name in args.workloads
    }
    results: dict[str, Any] = {"workloads": {}}
    flops_of: dict[tuple[str, str], float] = {}
    for name, workload in workloads.items():
        mean_len = (workload.num_prompt_tokens + workload.num_output_tokens) / len(workload.prompts)
        num_concurrency = max(
            counts[name], math.ceil(CONCURRENCY_DEMAND * budget_blocks * BLOCK_SIZE / mean_len)
        )
        concurrency_workload = build_workload(
            name, num_concurrency, args.seed, tokenizer, vocab_size, context_len, **data, **caps
        )
        results["workloads"][name] = {
            "num_requests": len(workload.prompts),
            "prompt_len": length_stats([len(p) for p in workload.prompts]),
            "output_len": length_stats(workload.output_lens),
            "concurrency": run_concurrency(
                args.model, concurrency_workload, budget_blocks, budget_context
            ),
            "dtypes": {},
        }
        if window is not None:
            results["workloads"][name]["window_freeing"] = run_window_freeing(
                args.model, workload, args.window_budget_blocks, args.dtypes[0], window
            )

    for dtype in args.dtypes:
        gc.collect()
        reset_peak_rss()  # this dtype's own peak, not an earlier dtype's or transformers'
        llm = LLM(
            model=args.model,
            block_size=BLOCK_SIZE,
            num_kv_blocks=num_kv_blocks,
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            dtype=dtype,
        )
        warm_up_quire(llm, warmup)
        quire_runs = {}
        for name, workload in workloads.items():
            quire_runs[name] = run_quire(llm, workload, f"quire {name} {dtype}")
            flops_of[name, dtype] = quire_flops(llm.engine, quire_runs[name])
            gc.collect()
        quire_rss = peak_rss_mib()
        engine_blocks = llm.engine.allocator.num_blocks
        # What one token's KV takes in every layer (the pool is sized by it; a sliding layer of a
        # model that frees outside its window holds at most its window's worth per sequence).
        kv_per_token = kv_bytes_per_token(llm.engine.model.config, llm.engine.dtype)
        del llm
        gc.collect()
        for name, workload in workloads.items():
            quire = quire_runs[name]
            vllm_run = VLLMRun(error="skipped (--skip-vllm)")
            if not args.skip_vllm:
                vllm_run = run_vllm(
                    args.model,
                    workload,
                    warmup,
                    dtype=dtype,
                    block_size=BLOCK_SIZE,
                    max_num_seqs=MAX_NUM_SEQS,
                    max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                    max_model_len=context_len,
                    label=f"vllm {name} {dtype}",
                    num_threads=args.threads,
                )
            static = continuous = HFRun(error=f"skipped (--hf-dtypes {' '.join(args.hf_dtypes)})")
            if dtype in args.hf_dtypes:
                hf = load_hf_model(args.model, dtypes[dtype])
                warm_up_hf_static(hf, vocab_size, pad_id)
                static = run_hf_static(hf, workload, args.hf_batch_size, pad_id)
                gc.collect()
                continuous = run_hf_continuous(
                    hf,
                    workload,
                    engine_blocks * BLOCK_SIZE,
                    MAX_NUM_BATCHED_TOKENS,
                    MAX_NUM_SEQS,
                )
                del hf
                gc.collect()
            quire_tok_s = quire.num_output_tokens / quire.wall_s
            identical = None
            if vllm_run.token_ids is not None:
                identical = sum(
                    a == b for a, b in zip(quire.token_ids, vllm_run.token_ids, strict=True)
                )
            results["workloads"][name]["dtypes"][dtype] = {
                "quire_tok_s": quire_tok_s,
                "vllm_tok_s": vllm_run.tok_s,
                "hf_static_tok_s": static.tok_s,
                "hf_continuous_tok_s": continuous.tok_s,
                "ratio_vs_vllm": ratio(quire_tok_s, vllm_run.tok_s),
                "ratio_vs_hf_static": ratio(quire_tok_s, static.tok_s),
                "ratio_vs_hf_continuous": ratio(quire_tok_s, continuous.tok_s),
                "tokens_identical_to_vllm": identical,
                "quire_wall_s": quire.wall_s,
                "vllm_wall_s": vllm_run.wall_s,
                "hf_static_wall_s": static.wall_s,
                "hf_continuous_wall_s": continuous.wall_s,
                "quire_peak_rss_mib": quire_rss,
                "vllm_peak_rss_mib": vllm_run.peak_rss_mib,
                "vllm_error": vllm_run.error,
                "hf_static_error": static.error,
                "hf_continuous_error": continuous.error,
                "vllm": vllm_run.details,
                "hf_static": static.details,
                "hf_continuous": continuous.details,
                "quire_num_steps": quire.num_steps,
                "quire_num_preemptions": quire.num_preemptions,
                "quire_tokens_computed": quire.num_tokens_computed,
                "quire_num_kv_blocks": engine_blocks,
                "quire_kv_bytes_per_token": kv_per_token,
                **kv_summary(quire),
            }

    peaks = {d: max(peaks_start[d], matmul_flops(t)) for d, t in dtypes.items()}
    for (name, dtype), flops in flops_of.items():
        entry = results["workloads"][name]["dtypes"][dtype]
        entry["quire_achieved_gflop_s"] = flops / entry["quire_wall_s"] / 1e9
        entry["matmul_fraction"] = flops / entry["quire_wall_s"] / peaks[dtype]
        if entry["vllm_wall_s"]:
            entry["vllm_achieved_gflop_s"] = flops / entry["vllm_wall_s"] / 1e9
            entry["vllm_matmul_fraction"] = flops / entry["vllm_wall_s"] / peaks[dtype]
    machine["matmul_gflop_s"] = {d: p / 1e9 for d, p in peaks.items()}
    machine["matmul_gflop_s_start"] = {d: p / 1e9 for d, p in peaks_start.items()}
    machine["load_average_end"] = list(os.getloadavg())
    results["machine"] = machine
    results["config"] = {
        "model": args.model,
        "seed": args.seed,
        "quick": args.quick,
        "workloads": args.workloads,
        "num_requests": counts,
        "dtypes": args.dtypes,
        "hf_dtypes": args.hf_dtypes,
        "length_caps": caps,
        "context_len": context_len,
        "block_size": BLOCK_SIZE,
        "max_num_seqs": MAX_NUM_SEQS,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "hf_batch_size": args.hf_batch_size,
        "torch_threads": torch.get_num_threads(),
        "concurrency_budget_blocks": budget_blocks,
        "concurrency_budget_contexts": budget_contexts,
        "concurrency_demand": CONCURRENCY_DEMAND,
        "sliding_window": window,
        "window_budget_blocks": args.window_budget_blocks,
        "matmul_size": {d: matmul_size(t) for d, t in dtypes.items()},
        "warmup": {
            "prompt_lens": [len(p) for p in warmup.prompts],
            "output_lens": warmup.output_lens,
        },
    }
    results["definitions"] = DEFINITIONS

    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "engine.json", results)
    draw(results, args.out / "engine.png")
    print_table(results)
    print(f"wrote {args.out / 'engine.json'} and {args.out / 'engine.png'}")
    return results


if __name__ == "__main__":
    main()
