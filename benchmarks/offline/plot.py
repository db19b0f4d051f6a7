"""engine.png: each system's throughput per workload and dtype, and Quire's KV utilization over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.report import annotate_bars, pyplot


def draw(results: dict[str, Any], path: Path) -> None:
    """Bars of output tok/s per system; the first column's KV-utilization timeline."""
    plt = pyplot()
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
        annotate_bars(bars, drawn, [run.get(key) for _, run in columns], fontsize=7)
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
