"""What a Quire run made of its KV pool and its FLOPs: time-weighted utilization, the timeline."""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.common.stats import time_weighted_mean
from benchmarks.offline.config import TIMELINE_POINTS
from benchmarks.offline.quire_run import QuireRun, StepSample
from quire.engine.llm_engine import LLMEngine


def time_weighted(samples: list[StepSample], numerator: str, denominator: str) -> float:
    """numerator / denominator of each step sample, weighted by the step's wall time."""
    values = [getattr(s, numerator) / getattr(s, denominator) for s in samples]
    return time_weighted_mean(values, [s.duration_s for s in samples])


def quire_flops(engine: LLMEngine, run: QuireRun) -> float:
    """Useful FLOPs of a run: decoder linears, the lm_head rows, attention scores and values."""
    model, c = engine.model, engine.model.config
    layer_params = sum(
        layer.attention.num_params + layer.mlp.num_active_params for layer in model.layers
    )
    attention = 4 * c.num_layers * c.num_heads * c.head_dim * run.attention_context_sum
    return (
        2 * layer_params * run.num_tokens_computed
        + 2 * model.lm_head.num_params * run.num_logit_rows
        + attention
    )


def kv_summary(run: QuireRun) -> dict[str, Any]:
    """Time-weighted KV utilization (paged and contiguous) and a thinned timeline."""
    samples = run.samples
    keep = np.unique(
        np.linspace(0, len(samples) - 1, min(len(samples), TIMELINE_POINTS)).astype(int)
    )
    return {
        "kv_utilization": time_weighted(samples, "num_slot_tokens", "num_block_slots"),
        "contiguous_kv_utilization": time_weighted(samples, "num_tokens", "num_reserved_exact"),
        "contiguous_kv_utilization_full_context": time_weighted(
            samples, "num_tokens", "num_reserved_context"
        ),
        "kv_timeline": {
            "time_s": [round(samples[i].time_s, 3) for i in keep],
            "quire": [
                round(samples[i].num_slot_tokens / samples[i].num_block_slots, 4) for i in keep
            ],
            "contiguous": [
                round(samples[i].num_tokens / samples[i].num_reserved_exact, 4) for i in keep
            ],
            "contiguous_full_context": [
                round(samples[i].num_tokens / samples[i].num_reserved_context, 4) for i in keep
            ],
            "num_running": [samples[i].num_running for i in keep],
        },
    }
