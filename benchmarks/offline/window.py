"""Blocks outside the sliding window: the same requests in the same KV budget (bytes), with the
engine's `free_outside_window` on and off, for a model whose every layer slides (Mistral-shaped)
or that mixes sliding and global layers (Gemma-shaped: its layers in KV groups, each with a
table of its own).

Freeing lets a decoding sequence hold its window's blocks (plus one) instead of all of them in
every sliding layer, so more sequences fit in the budget. Both runs are the real engine and model (greedy, forced output
lengths), back to back in one process; each reports the running sequences (peak, and mean over
the saturated steps, as the concurrency run defines them, and over every step: the one that
does not depend on the machine's speed), steps, preemptions and output tokens/s.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np

from benchmarks.offline.concurrency import budget_llm, saturated
from benchmarks.offline.quire_run import QuireRun, run_quire
from benchmarks.offline.workloads import Workload
from quire.model.attention_layout import kv_groups
from quire.model.checkpoint import load_model_config


def freeable_window(model: str) -> int | None:
    """The window of `model`'s sliding layers when freeing outside it releases blocks (every
    layer slides, or the layers form KV groups), else None."""
    config = load_model_config(model)
    groups = kv_groups(config.attention, config.num_layers, free_outside_window=True)
    return next((w for w in groups.windows if w is not None), None)


def run_window_freeing(
    model: str, workload: Workload, budget_blocks: int, dtype: str, window: int
) -> dict[str, Any]:
    """`workload` in `budget_blocks` with blocks outside the window freed, then kept."""
    runs: dict[str, QuireRun] = {}
    pools: dict[str, dict[str, int]] = {}
    for label, free in (("freed", True), ("kept", False)):
        llm = budget_llm(model, budget_blocks, dtype=dtype, free_outside_window=free)
        pools[label] = {
            "num_blocks": llm.engine.allocator.num_blocks,
            "num_kv_groups": llm.engine.runner.groups.num_groups,
        }
        runs[label] = run_quire(llm, workload, f"quire {workload.name} window blocks {label}")
        del llm
        gc.collect()
    result: dict[str, Any] = {
        "window": window,
        "budget_blocks": budget_blocks,
        "num_requests": len(workload.prompts),
        "dtype": dtype,
        "tokens_identical": runs["freed"].token_ids == runs["kept"].token_ids,
    }
    for label, run in runs.items():
        result[label] = {**pools[label], **_summary(run)}
    freed, kept = result["freed"], result["kept"]
    result["peak_running_ratio"] = freed["peak_running"] / kept["peak_running"]
    result["mean_running_ratio"] = freed["mean_running"] / kept["mean_running"]
    result["tok_s_ratio"] = freed["tok_s"] / kept["tok_s"]
    return result


def _summary(run: QuireRun) -> dict[str, Any]:
    window = saturated(run.samples)
    return {
        "peak_running": max(s.num_running for s in run.samples),
        "mean_running": float(np.mean([s.num_running for s in run.samples])),
        "mean_running_saturated": (
            float(np.mean([s.num_running for s in window])) if window else None
        ),
        "num_saturated_steps": len(window),
        "num_preemptions": run.num_preemptions,
        "num_steps": run.num_steps,
        "wall_s": run.wall_s,
        "tok_s": run.num_output_tokens / run.wall_s,
    }
