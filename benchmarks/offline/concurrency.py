"""How many sequences a fixed KV budget holds: Quire's paged pool against contiguous reservation."""

from __future__ import annotations

import gc
from collections import deque
from typing import Any

import numpy as np

from benchmarks.offline.config import BLOCK_SIZE, CONCURRENCY_MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS
from benchmarks.offline.quire_run import StepSample, run_quire
from benchmarks.offline.workloads import Workload
from quire import LLM
from quire.model.attention_layout import kv_groups
from quire.model.checkpoint import load_model_config


def run_concurrency(
    model: str, workload: Workload, budget_blocks: int, context_len: int
) -> dict[str, Any]:
    """Quire in a fixed KV budget against contiguous reservation of the same budget."""
    llm = budget_llm(model, budget_blocks)
    run = run_quire(llm, workload, f"quire {workload.name} concurrency", stub_forward=True)
    del llm
    gc.collect()
    samples = run.samples
    window = saturated(samples)
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


def blocks_in_budget(model: str, budget_blocks: int, free_outside_window: bool = True) -> int:
    """The engine's KV blocks that take the bytes of `budget_blocks` blocks of every layer's
    KV: a hybrid model freeing outside its window has blocks of fewer layers each (KV groups,
    quire.model.attention_layout), so more of them fit in the same memory."""
    config = load_model_config(model)
    groups = kv_groups(config.attention, config.num_layers, free_outside_window)
    return budget_blocks * config.num_layers // groups.num_slots


def budget_llm(model: str, budget_blocks: int, **engine: Any) -> LLM:
    """An `LLM` whose KV pool is the budget (`budget_blocks` blocks of every layer's KV, in
    bytes) and whose sequence limit never binds."""
    free = bool(engine.get("free_outside_window", True))
    return LLM(
        model=model,
        block_size=BLOCK_SIZE,
        num_kv_blocks=blocks_in_budget(model, budget_blocks, free),
        max_num_seqs=CONCURRENCY_MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        **engine,
    )


def saturated(samples: list[StepSample]) -> list[StepSample]:
    """The steps from the first where the pool refused an admission or preempted to the last
    with a non-empty waiting queue (none when the pool never filled)."""
    refused = [i for i, s in enumerate(samples) if s.pool_refused]
    waiting = [i for i, s in enumerate(samples) if s.num_waiting > 0]
    return samples[refused[0] : waiting[-1] + 1] if refused and waiting else []


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
