"""Bars per policy: TTFT p50/p99, TPOT p99, output throughput, hit rate beside the oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common.report import pyplot

PANELS = (
    ("ttft_p50_ms", "TTFT p50 (ms)"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("tpot_p99_ms", "TPOT p99 (ms)"),
    ("output_tok_s", "output tok/s"),
    ("hit_rate", "prefix hit rate"),
)


def plot(results: dict[str, Any], path: Path, title: str) -> None:
    """One row per workload, one panel per figure; the hit-rate panel draws the oracle line."""
    plt = pyplot()
    workloads = results["workloads"]
    fig, axes = plt.subplots(
        len(workloads),
        len(PANELS),
        figsize=(3.2 * len(PANELS), 3.0 * len(workloads)),
        squeeze=False,
    )
    for row, (name, w) in enumerate(workloads.items()):
        policies = list(w["policies"])
        for col, (key, label) in enumerate(PANELS):
            ax = axes[row][col]
            values = [w["policies"][p][key] or 0.0 for p in policies]
            bars = ax.bar(policies, values, color=["C0", "C1", "C2", "C3", "C4"][: len(policies)])
            for bar, v in zip(bars, values, strict=True):
                text = f"{v:.2f}" if key == "hit_rate" else f"{v:.0f}"
                ax.annotate(
                    text,
                    (bar.get_x() + bar.get_width() / 2, v),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
            if key == "hit_rate":
                ax.axhline(
                    w["oracle_hit_rate"], color="k", linestyle="--", linewidth=1, label="oracle"
                )
                ax.set_ylim(0, 1.05)
                ax.legend(fontsize=7, loc="lower right")
            ax.set_title(f"{name}: {label}", fontsize=9)
            ax.tick_params(axis="x", labelsize=7, rotation=20)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
