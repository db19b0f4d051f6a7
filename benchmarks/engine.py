"""Offline engine benchmark: Quire beside transformers on ShareGPT- and Alpaca-shaped workloads.

    python -m benchmarks.engine [--model DIR] [--workloads sharegpt alpaca]
        [--num-requests N | NAME=N ...] [--hf-batch-size B] [--skip-hf] [--seed S]
        [--threads N] [--out DIR] [--quick]

Workloads. Prompt and output lengths are lognormal with sigma = 0.9 and mu = ln(mean) -
sigma^2 / 2, so that the *mean* is the one the PagedAttention paper reports for its traces
(ShareGPT: 161 input / 338 output tokens; Alpaca: 19 / 58). Prompts are clipped to
[1, context - 1] and outputs to [1, context - prompt], so every request fits the model's
context. Prompts are random token ids in [5, vocab) (ids 0-4 are special). Every system gets
the same prompts and output lengths and is forced to produce exactly that many tokens (EOS
ignored or suppressed); only those requested tokens count.

Systems, all float32 on the CPU in this process, each timed from its first request to its
last token (model load and warmup excluded):
  quire          LLM(...) driven through llm.engine.add_request / step.
  hf_static      transformers generate() on static batches of --hf-batch-size requests in
                 arrival order, left padded; a batch runs until its longest request is done.
  hf_continuous  transformers' continuous batching (the ContinuousBatchingManager behind
                 model.generate_batch), given the same KV capacity and step budgets as Quire.
                 generate_batch takes one max_new_tokens for all requests, so the manager it
                 wraps is driven directly: its add_request takes max_new_tokens per request.

KV utilization, the fixed-budget concurrency and the FLOP fraction are defined in
DEFINITIONS below, which is also written into the JSON. The concurrency run uses more
requests than the throughput run (CONCURRENCY_DEMAND times the budget in tokens, the same
seeded stream extended) so that the pool stays full for a while. Writes <out>/engine.json and
<out>/engine.png (default bench/results). The defaults should take about 10 minutes on 2 idle
cores (an estimate from per-step timings; the one full run so far, on a loaded machine, took 30).

Timing on a shared machine: a process busy on one core stalls torch's two-thread team at
every op, which slows a run many-fold (one quire-tiny generate() call measured 0.4 s idle and
12 s beside a busy process). The
JSON records the load average before and after; compare it across runs, or use --threads 1
for steadier (not faster) figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import platform
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from quire import LLM, SamplingParams
from quire.engine.llm_engine import LLMEngine
from quire.engine.scheduler import SchedulerOutput

LENGTH_SIGMA = 0.9  # lognormal sigma of prompt and output lengths (both workloads)
FIRST_REGULAR_TOKEN_ID = 5  # ids 0-4 are pad/bos/eos/unk/... in the generated tokenizers
BLOCK_SIZE = 16  # Quire's KV block size (tokens)
MAX_NUM_SEQS = 256  # Quire's and transformers' continuous-batching sequence budget
MAX_NUM_BATCHED_TOKENS = 2048  # tokens per step (prefill chunks + decodes), both engines
CONCURRENCY_BUDGET_CONTEXTS = 8  # fixed KV budget: this many full-context sequences' worth
CONCURRENCY_DEMAND = 3.0  # concurrency run: total tokens requested / budget tokens
CONCURRENCY_MAX_NUM_SEQS = 4096  # large: only the KV budget should bound concurrency
# Static batch for generate(): on 2 cores a quire-bench decode step costs about the same at
# 4, 8 and 16 rows (~70 ms; 32 rows: ~110 ms), so 16 is the fastest once the longer tail of a
# bigger batch is priced in (measured: est. 42 tok/s at 8, 68 at 16, 72 at 32 on ShareGPT).
HF_BATCH_SIZE = 16
MATMUL_SIZE = 2048  # square float32 matmul that stands for the machine's peak FLOP/s
TIMELINE_POINTS = 300  # at most this many KV-utilization samples go into the JSON


@dataclass(frozen=True)
class WorkloadSpec:
    """Mean lengths of one trace, as the PagedAttention paper reports them."""

    name: str
    mean_prompt_len: float
    mean_output_len: float
    default_num_requests: int  # sized so the whole benchmark takes ~10 minutes on 2 cores


WORKLOADS = {
    "sharegpt": WorkloadSpec("sharegpt", 161, 338, 24),
    "alpaca": WorkloadSpec("alpaca", 19, 58, 96),
}

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
    "matmul_fraction": "Quire achieved FLOP/s / best float32 matmul FLOP/s measured in this "
    "run. Achieved = (2 * decoder linear params * tokens computed (prefill + decode) + 2 * "
    "lm_head params * logit rows + 4 * layers * heads * head_dim * sum of context lengths "
    "over computed tokens) / Quire wall time; embedding lookups and norms are not counted",
}


# --- workloads -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """Prompts (token ids) and the exact number of tokens each request must produce."""

    name: str
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    def head(self, n: int) -> Workload:
        return Workload(self.name, self.prompts[:n], self.output_lens[:n])


def lognormal_lengths(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    """n lognormal draws whose distribution has the given mean, rounded, at least 1."""
    mu = math.log(mean) - sigma**2 / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, sigma, size=n))).astype(np.int64)


def make_workload(
    spec: WorkloadSpec,
    n: int,
    seed: int,
    vocab_size: int,
    context_len: int,
    max_prompt_len: int | None = None,
    max_output_len: int | None = None,
) -> Workload:
    """A seeded workload; its first k requests are the same for every n >= k."""
    stream = list(WORKLOADS).index(spec.name)
    prompt_lens = lognormal_lengths(
        np.random.default_rng([seed, stream, 0]), spec.mean_prompt_len, LENGTH_SIGMA, n
    )
    output_lens = lognormal_lengths(
        np.random.default_rng([seed, stream, 1]), spec.mean_output_len, LENGTH_SIGMA, n
    )
    token_rng = np.random.default_rng([seed, stream, 2])
    prompts, outputs = [], []
    for p, o in zip(prompt_lens.tolist(), output_lens.tolist(), strict=True):
        p = min(p, context_len - 1, max_prompt_len or context_len)
        o = min(o, context_len - p, max_output_len or context_len)
        prompts.append(token_rng.integers(FIRST_REGULAR_TOKEN_ID, vocab_size, size=p).tolist())
        outputs.append(o)
    return Workload(spec.name, prompts, outputs)


def length_stats(lengths: list[int]) -> dict[str, float]:
    a = np.asarray(lengths)
    return {
        "mean": float(a.mean()),
        "p50": float(np.median(a)),
        "p90": float(np.percentile(a, 90)),
        "min": int(a.min()),
        "max": int(a.max()),
        "total": int(a.sum()),
    }


# --- the machine -----------------------------------------------------------------------------


def matmul_flops(n: int = MATMUL_SIZE, repeats: int = 5) -> float:
    """Best FLOP/s of one float32 [n, n] @ [n, n] matmul over a few repeats."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
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
    duration_s: float  # the step's wall time, probe excluded (the sample's weight)
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


class _EngineProbe:
    """Hooks one LLMEngine's allocator and runner (instance attributes, engine code untouched).

    Its own time is measured so the caller can take it out of the engine's.
    """

    def __init__(self, engine: LLMEngine, stub_forward: bool) -> None:
        self.engine = engine
        self.stub_forward = stub_forward
        self.overhead_s = 0.0
        self.num_tokens_computed = 0
        self.num_logit_rows = 0
        self.attention_context_sum = 0
        self.samples: list[StepSample] = []
        self._partial: dict[str, Any] | None = None
        self._refused = False
        self._step_overhead_s = 0.0
        self._allocator = engine.scheduler.allocator
        self._allocate = self._allocator.step
        self._execute = engine.runner.execute
        self._allocator.step = self._allocate_hook  # type: ignore[method-assign]
        engine.runner.execute = self._execute_hook  # type: ignore[method-assign]

    def detach(self) -> None:
        del self._allocator.step
        del self.engine.runner.execute

    def _allocate_hook(self, request: Any) -> Any:
        result = self._allocate(request)
        self._refused = self._refused or bool(result.not_admitted or result.preempted)
        return result

    def _execute_hook(self, step: SchedulerOutput) -> torch.Tensor:
        start = perf_counter()
        engine = self.engine
        running = engine.scheduler.running
        num_rows = 0
        for s in step.scheduled:
            c, n = s.num_computed_tokens, s.num_new_tokens
            self.num_tokens_computed += n
            self.attention_context_sum += n * (2 * c + n + 1) // 2  # sum of (p + 1), p in [c, c+n)
            num_rows += s.samples
        self.num_logit_rows += num_rows
        self._partial = {
            "num_running": len(running),
            "num_waiting": len(engine.scheduler.waiting),
            "num_tokens": sum(s.num_tokens for s in running),
            "num_block_slots": engine.allocator.stats().num_blocks_used
            * engine.allocator.block_size,
            "num_reserved_exact": sum(
                s.num_prompt_tokens + s.request.params.max_tokens for s in running
            ),
            "num_reserved_context": len(running) * engine.max_model_len,
            "pool_refused": self._refused,
        }
        self._refused = False
        self._step_overhead_s += perf_counter() - start
        if self.stub_forward:
            return torch.zeros(num_rows, engine.model.config.vocab_size)
        return self._execute(step)

    def end_step(self, time_s: float, duration_s: float) -> None:
        self.overhead_s += self._step_overhead_s
        if self._partial is not None:
            self.samples.append(
                StepSample(time_s, duration_s - self._step_overhead_s, **self._partial)
            )
        self._partial, self._step_overhead_s = None, 0.0


def run_quire(llm: LLM, workload: Workload, label: str, stub_forward: bool = False) -> QuireRun:
    """Queue every request, step until all are done, sample each step."""
    engine = llm.engine
    steps_before = engine.num_steps
    preemptions_before = engine.scheduler.num_preemptions
    probe = _EngineProbe(engine, stub_forward)
    expected: dict[str, int] = {}
    try:
        with tqdm(total=workload.num_output_tokens, desc=label, unit="tok") as bar:
            start = perf_counter()
            for i, (prompt, n) in enumerate(
                zip(workload.prompts, workload.output_lens, strict=True)
            ):
                request_id = f"{label}-{i}"
                expected[request_id] = n
                params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
                engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
            last = start
            while engine.has_unfinished_requests():
                outputs = engine.step()
                now = perf_counter()
                probe.end_step(now - start, now - last)
                last = now
                for out in outputs:
                    if out.finished:
                        got = len(out.outputs[0].token_ids)
                        assert got == expected[out.request_id], (
                            f"{out.request_id} produced {got} tokens, asked for "
                            f"{expected[out.request_id]}"
                        )
                        bar.update(got)
            wall_s = perf_counter() - start - probe.overhead_s
    finally:
        probe.detach()
    return QuireRun(
        wall_s=wall_s,
        num_output_tokens=workload.num_output_tokens,
        num_steps=engine.num_steps - steps_before,
        num_preemptions=engine.scheduler.num_preemptions - preemptions_before,
        samples=probe.samples,
        num_tokens_computed=probe.num_tokens_computed,
        num_logit_rows=probe.num_logit_rows,
        attention_context_sum=probe.attention_context_sum,
    )


def warm_up_quire(llm: LLM, vocab_size: int) -> None:
    rng = np.random.default_rng(12345)
    prompts = [
        {"prompt_token_ids": rng.integers(FIRST_REGULAR_TOKEN_ID, vocab_size, 40).tolist()}
        for _ in range(2)
    ]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), False)


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
        w.numel() for layer in model.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)
    )
    attention = 4 * c.num_layers * c.num_heads * c.head_dim * run.attention_context_sum
    return (
        2 * layer_params * run.num_tokens_computed
        + 2 * model.lm_head.numel() * run.num_logit_rows
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


# --- transformers ----------------------------------------------------------------------------


@dataclass
class HFRun:
    """One workload through a transformers path; `error` says why it did not run."""

    wall_s: float | None = None
    tok_s: float | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def load_hf_model(model: str) -> Any:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    return hf.eval()


@torch.inference_mode()
def run_hf_static(
    hf: Any, workload: Workload, batch_size: int, pad_id: int, progress: bool = True
) -> HFRun:
    """generate() on arrival-order batches; each request counts only its own tokens."""
    label = f"hf-static {workload.name} (B={batch_size})"
    num_generated = 0  # including tokens past a request's own length (the batch's waste)
    total = workload.num_output_tokens
    with tqdm(total=total, desc=label, unit="tok", disable=not progress) as bar:
        start = perf_counter()
        for b in range(0, len(workload.prompts), batch_size):
            prompts = workload.prompts[b : b + batch_size]
            lens = workload.output_lens[b : b + batch_size]
            width, new_tokens = max(map(len, prompts)), max(lens)
            input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
            for row, prompt in enumerate(prompts):  # left padding
                input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
                attention_mask[row, width - len(prompt) :] = 1
            out = hf.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,  # suppresses EOS until the batch's longest is done
                do_sample=False,
                pad_token_id=pad_id,
            )
            assert out.shape[1] == width + new_tokens, f"batch generated {out.shape[1] - width}"
            num_generated += len(prompts) * new_tokens
            bar.update(sum(lens))
        wall_s = perf_counter() - start
    return HFRun(
        wall_s,
        workload.num_output_tokens / wall_s,
        details={"batch_size": batch_size, "num_tokens_generated_incl_padding": num_generated},
    )


def warm_up_hf_static(hf: Any, vocab_size: int, pad_id: int) -> None:
    prompts = np.random.default_rng(54321).integers(FIRST_REGULAR_TOKEN_ID, vocab_size, (2, 40))
    warm = Workload("warmup", prompts.tolist(), [4, 4])
    run_hf_static(hf, warm, 2, pad_id, progress=False)


class _CBLogFilter(logging.Filter):
    """Keeps transformers' continuous-batching errors for the report; drops the psutil noise.

    Without psutil it cannot read CPU memory, which only matters when it sizes its own cache;
    here num_blocks and max_batch_tokens are given.
    """

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "psutil" in message:
            return False
        if record.levelno >= logging.ERROR:
            self.errors.append(message.splitlines()[0][:300])
        return True


def run_hf_continuous(
    hf: Any, workload: Workload, num_kv_tokens: int, timeout_s: float = 1800
) -> HFRun:
    """transformers' continuous batching with per-request max_new_tokens and no EOS."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    label = f"hf-continuous {workload.name}"
    page_size = ContinuousBatchingConfig().page_size
    cb_config = ContinuousBatchingConfig(
        num_blocks=-(-num_kv_tokens // page_size),  # same KV capacity as Quire's pool
        max_batch_tokens=MAX_NUM_BATCHED_TOKENS,
        max_requests_per_batch=MAX_NUM_SEQS,
    )
    details = {
        "page_size": page_size,
        "num_blocks": cb_config.num_blocks,
        "max_batch_tokens": MAX_NUM_BATCHED_TOKENS,
        "max_requests_per_batch": MAX_NUM_SEQS,
        "attn_implementation": hf.config._attn_implementation,
        "api": "continuous_batching_context_manager + add_request(max_new_tokens=L, "
        "eos_token_id=-1): generate_batch accepts one max_new_tokens for every request",
    }
    generation_config = GenerationConfig(
        max_new_tokens=max(workload.output_lens), do_sample=False, eos_token_id=-1
    )
    log_filter = _CBLogFilter()
    cb_logger = logging.getLogger("ContinuousBatchingLogger")
    cb_logger.addFilter(log_filter)
    expected = {f"r{i}": n for i, n in enumerate(workload.output_lens)}
    try:
        with (
            hf.continuous_batching_context_manager(
                generation_config=generation_config,
                continuous_batching_config=cb_config,
                block=True,
                timeout=30,
            ) as manager,
            tqdm(total=workload.num_output_tokens, desc=label, unit="tok") as bar,
        ):
            start = perf_counter()
            for (request_id, n), prompt in zip(expected.items(), workload.prompts, strict=True):
                manager.add_request(
                    prompt, request_id=request_id, max_new_tokens=n, eos_token_id=-1
                )
            done: set[str] = set()
            while len(done) < len(expected):
                result = manager.get_result(timeout=1)
                if result is None:
                    if not manager.is_running() or perf_counter() - start > timeout_s:
                        raise RuntimeError(
                            f"generation stopped with {len(expected) - len(done)} requests left"
                        )
                    continue
                if not result.is_finished():
                    continue
                if result.error is not None:
                    raise RuntimeError(f"request {result.request_id} failed: {result.error}")
                got = len(result.generated_tokens)
                if got != expected[result.request_id]:
                    raise RuntimeError(
                        f"{result.request_id} produced {got} tokens, "
                        f"asked for {expected[result.request_id]}"
                    )
                done.add(result.request_id)
                bar.update(got)
            wall_s = perf_counter() - start
        return HFRun(wall_s, workload.num_output_tokens / wall_s, details=details)
    except Exception as exc:  # report the reason in the JSON instead of failing the benchmark
        reason = f"{type(exc).__name__}: {exc}"
        if log_filter.errors:
            reason += f" (transformers logged: {'; '.join(log_filter.errors[-3:])})"
        return HFRun(error=reason, details=details)
    finally:
        cb_logger.removeFilter(log_filter)


# --- report ----------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(value: Any, spec: str = ".1f") -> str:
    return "n/a" if value is None else format(value, spec)


def print_table(results: dict[str, Any]) -> None:
    workloads = results["workloads"]
    names = list(workloads)
    batch = results["config"]["hf_batch_size"]
    rows: list[tuple[str, str, str]] = [
        ("output tok/s: quire", "quire_tok_s", ".1f"),
        (f"output tok/s: hf static (B={batch})", "hf_static_tok_s", ".1f"),
        ("output tok/s: hf continuous", "hf_continuous_tok_s", ".1f"),
        ("quire / hf static", "ratio_vs_hf_static", ".2f"),
        ("quire / hf continuous", "ratio_vs_hf_continuous", ".2f"),
        ("KV utilization: quire (paged)", "kv_utilization", ".3f"),
        ("KV utilization: contiguous, prompt+max_tokens", "contiguous_kv_utilization", ".3f"),
        (
            "KV utilization: contiguous, full context",
            "contiguous_kv_utilization_full_context",
            ".3f",
        ),
        ("matmul fraction (quire)", "matmul_fraction", ".3f"),
    ]
    width = 46
    lines = [f"{'':<{width}}" + "".join(f"{n:>14}" for n in names)]
    for title, key, spec in rows:
        lines.append(
            f"{title:<{width}}" + "".join(f"{fmt(workloads[n][key], spec):>14}" for n in names)
        )
    for title, key, spec in [
        ("concurrency: quire mean (saturated)", "quire_mean_running_saturated", ".1f"),
        ("concurrency: quire peak", "quire_peak_running", "d"),
        ("concurrency: contiguous, workload max", "contiguous_num_seqs", "d"),
        ("concurrency: contiguous oracle (simulated)", "contiguous_oracle_mean_running", ".1f"),
        ("concurrency: contiguous, full context", "contiguous_num_seqs_full_context", "d"),
        ("concurrency ratio (mean / workload max)", "concurrency_ratio", ".2f"),
        ("concurrency ratio vs oracle", "concurrency_ratio_vs_oracle", ".2f"),
    ]:
        cells = "".join(f"{fmt(workloads[n]['concurrency'][key], spec):>14}" for n in names)
        lines.append(f"{title:<{width}}" + cells)
    print("\n".join(lines))
    for n in names:
        if workloads[n]["hf_continuous_error"]:
            print(f"hf continuous on {n}: {workloads[n]['hf_continuous_error']}")
    machine = results["machine"]
    print(
        f"matmul peak {machine['matmul_gflop_s']:.1f} GFLOP/s on {machine['logical_cpus']} CPUs; "
        f"load average at start {machine['load_average_start'][0]:.2f}"
    )


def draw(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = results["workloads"]
    names = list(workloads)
    systems = [
        ("quire", "quire_tok_s"),
        ("hf static", "hf_static_tok_s"),
        ("hf continuous", "hf_continuous_tok_s"),
    ]
    fig, (bars, timeline) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = np.arange(len(names))
    for i, (label, key) in enumerate(systems):
        values = [workloads[n][key] or 0.0 for n in names]
        drawn = bars.bar(x + (i - 1) * 0.27, values, 0.27, label=label)
        for rect, n in zip(drawn, names, strict=True):
            text = "n/a" if workloads[n][key] is None else f"{workloads[n][key]:.0f}"
            bars.annotate(
                text,
                (rect.get_x() + rect.get_width() / 2, rect.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    bars.set_xticks(x, names)
    bars.set_ylabel("output tokens / s")
    bars.set_title("Offline throughput (float32, CPU)")
    bars.legend()
    shown = "sharegpt" if "sharegpt" in workloads else names[0]
    line = workloads[shown]["kv_timeline"]
    timeline.plot(line["time_s"], line["quire"], label="quire (paged)")
    timeline.plot(line["time_s"], line["contiguous"], label="contiguous, prompt + max_tokens")
    timeline.plot(line["time_s"], line["contiguous_full_context"], label="contiguous, full context")
    timeline.set_ylim(0, 1.05)
    timeline.set_xlabel("seconds into the quire run")
    timeline.set_ylabel("KV slots holding a token")
    timeline.set_title(f"KV utilization over time ({shown})")
    timeline.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- main ------------------------------------------------------------------------------------


def parse_num_requests(items: list[str], names: list[str], quick: bool) -> dict[str, int]:
    counts = {
        n: QUICK["num_requests"] if quick else WORKLOADS[n].default_num_requests for n in names
    }
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint dir (default models/quire-bench)")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument(
        "--num-requests",
        nargs="*",
        default=[],
        metavar="N|NAME=N",
        help="requests per workload (default "
        + ", ".join(f"{s.name}={s.default_num_requests}" for s in WORKLOADS.values())
        + ")",
    )
    parser.add_argument(
        "--hf-batch-size", type=int, default=HF_BATCH_SIZE, help=f"static batch ({HF_BATCH_SIZE})"
    )
    parser.add_argument("--skip-hf", action="store_true", help="run Quire only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for every system (default: torch's own, all cores; 1 with --quick)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="output dir")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: quire-tiny, 4 short requests each"
    )
    args = parser.parse_args(argv)
    if args.hf_batch_size < 1:
        parser.error("--hf-batch-size must be >= 1")
    if args.model is None:
        args.model = QUICK["model"] if args.quick else "models/quire-bench"
    if args.threads is None and args.quick:
        args.threads = QUICK["threads"]
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(args.model)
    vocab_size = hf_config.vocab_size
    context_len = hf_config.max_position_embeddings
    pad_id = hf_config.pad_token_id if hf_config.pad_token_id is not None else 0
    counts = parse_num_requests(args.num_requests, args.workloads, args.quick)
    caps = {
        "max_prompt_len": QUICK["max_prompt_len"] if args.quick else None,
        "max_output_len": QUICK["max_output_len"] if args.quick else None,
    }
    budget_contexts = QUICK["budget_contexts"] if args.quick else CONCURRENCY_BUDGET_CONTEXTS
    budget_blocks = budget_contexts * -(-context_len // BLOCK_SIZE)

    machine = machine_info()
    peak_start = matmul_flops()

    llm = LLM(
        model=args.model,
        block_size=BLOCK_SIZE,
        num_kv_blocks=QUICK["num_kv_blocks"] if args.quick else None,  # None: Quire's default
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
    )
    num_kv_blocks = llm.engine.allocator.num_blocks
    warm_up_quire(llm, vocab_size)
    hf = None
    if not args.skip_hf:
        hf = load_hf_model(args.model)
        warm_up_hf_static(hf, vocab_size, pad_id)

    results: dict[str, Any] = {"workloads": {}}
    quire_runs: dict[str, tuple[QuireRun, float]] = {}
    for name in args.workloads:
        spec = WORKLOADS[name]
        workload = make_workload(spec, counts[name], args.seed, vocab_size, context_len, **caps)
        quire = run_quire(llm, workload, f"quire {name}")
        quire_runs[name] = (quire, quire_flops(llm.engine, quire))
        gc.collect()

        mean_len = np.mean(
            [len(p) + n for p, n in zip(workload.prompts, workload.output_lens, strict=True)]
        )
        num_concurrency = max(
            counts[name], math.ceil(CONCURRENCY_DEMAND * budget_blocks * BLOCK_SIZE / mean_len)
        )
        concurrency_workload = make_workload(
            spec, num_concurrency, args.seed, vocab_size, context_len, **caps
        )
        concurrency = run_concurrency(args.model, concurrency_workload, budget_blocks, context_len)

        static = continuous = HFRun(error="skipped (--skip-hf)")
        if hf is not None:
            static = run_hf_static(hf, workload, args.hf_batch_size, pad_id)
            gc.collect()
            continuous = run_hf_continuous(hf, workload, num_kv_blocks * BLOCK_SIZE)
            gc.collect()

        quire_tok_s = quire.num_output_tokens / quire.wall_s
        results["workloads"][name] = {
            "num_requests": len(workload.prompts),
            "prompt_len": length_stats([len(p) for p in workload.prompts]),
            "output_len": length_stats(workload.output_lens),
            "quire_tok_s": quire_tok_s,
            "hf_static_tok_s": static.tok_s,
            "hf_continuous_tok_s": continuous.tok_s,
            "ratio_vs_hf_static": ratio(quire_tok_s, static.tok_s),
            "ratio_vs_hf_continuous": ratio(quire_tok_s, continuous.tok_s),
            "quire_wall_s": quire.wall_s,
            "hf_static_wall_s": static.wall_s,
            "hf_continuous_wall_s": continuous.wall_s,
            "hf_static_error": static.error,
            "hf_continuous_error": continuous.error,
            "hf_static": static.details,
            "hf_continuous": continuous.details,
            "quire_num_steps": quire.num_steps,
            "quire_num_preemptions": quire.num_preemptions,
            "quire_tokens_computed": quire.num_tokens_computed,
            "concurrency_ratio": concurrency["concurrency_ratio"],
            "concurrency": concurrency,
            **kv_summary(quire),
        }

    peak = max(peak_start, matmul_flops())
    for name, (quire, flops) in quire_runs.items():
        entry = results["workloads"][name]
        entry["quire_achieved_gflop_s"] = flops / quire.wall_s / 1e9
        entry["matmul_fraction"] = flops / quire.wall_s / peak
    machine["matmul_gflop_s"] = peak / 1e9
    machine["matmul_gflop_s_start"] = peak_start / 1e9
    machine["load_average_end"] = list(os.getloadavg())
    results["machine"] = machine
    results["config"] = {
        "model": args.model,
        "seed": args.seed,
        "quick": args.quick,
        "length_distribution": f"lognormal, sigma={LENGTH_SIGMA}, mu=ln(mean)-sigma^2/2",
        "workload_means": {
            n: {"prompt": WORKLOADS[n].mean_prompt_len, "output": WORKLOADS[n].mean_output_len}
            for n in args.workloads
        },
        "length_caps": caps,
        "context_len": context_len,
        "dtype": "float32",
        "block_size": BLOCK_SIZE,
        "max_num_seqs": MAX_NUM_SEQS,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "num_kv_blocks": num_kv_blocks,
        "hf_batch_size": args.hf_batch_size,
        "torch_threads": torch.get_num_threads(),
        "concurrency_budget_blocks": budget_blocks,
        "concurrency_budget_contexts": budget_contexts,
        "concurrency_demand": CONCURRENCY_DEMAND,
        "matmul_size": MATMUL_SIZE,
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
