"""serving.png: latency, throughput and SLO load against rate, and the all-at-once bursts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.report import annotate_bars, pyplot
from benchmarks.online.config import SLO_LOAD_AXIS_MAX


def plot(results: dict[str, Any], path: Path) -> None:
    """serving.png: TTFT p99, TPOT p99, throughput and SLO load per rate; the bursts."""
    plt = pyplot()
    panels = [
        ("TTFT p99 (ms)", lambda r: r["ttft_ms"]["p99"], results["slo"]["ttft_ms"]),
        ("TPOT p99 (ms)", lambda r: r["tpot_ms"]["p99"], results["slo"]["tpot_ms"]),
        ("output tokens/s", lambda r: r["output_throughput"], None),
    ]
    # One colour per system across all panels.
    colors = {name: f"C{i}" for i, name in enumerate(results["systems"])}
    fig, grid = plt.subplots(3, 2, figsize=(13, 13))
    axes = list(grid.flat)
    plot_bursts(axes[4], axes[5], results, colors)
    for ax, (label, get, slo) in zip(axes, panels, strict=False):
        for name, system in results["systems"].items():
            runs = system.get("runs") or []
            pts = [(r["request_rate"], get(r)) for r in runs if get(r) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", color=colors[name], label=name)
        if slo is not None:
            ax.axhline(slo, color="grey", linestyle="--", label=f"SLO {slo:g} ms")
        ax.set_ylabel(label)
    plot_slo_load(axes[3], results, colors)
    rates = results["config"]["rates"]
    for ax in axes[:4]:
        # Linear in rate, as the sustainable rate's interpolation is.
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.set_xlabel("request rate (req/s)")
        ax.grid(alpha=0.3)
        ax.legend()
    config = results["config"]
    title = f"Serving under Poisson load: {config['model']}"
    if config["shared_prefix_len"] > 0:
        title += (
            f", shared prefix {config['shared_prefix_len']} tokens"
            f" x {config['num_shared_prefixes']} tenants"
        )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bursts(tput: Any, ttft: Any, results: dict[str, Any], colors: dict[str, str]) -> None:
    """Every request at once: output throughput and mean TTFT per system, by either client."""
    clients = [
        (
            "this client",
            lambda s: (s.get("burst") or {}).get("output_throughput"),
            lambda s: ((s.get("burst") or {}).get("ttft_ms") or {}).get("mean"),
        ),
        (
            "vLLM's client",
            lambda s: (s.get("vllm_client") or {}).get("output_throughput"),
            lambda s: (s.get("vllm_client") or {}).get("mean_ttft_ms"),
        ),
    ]
    names = [n for n, s in results["systems"].items() if s.get("status") == "ok"]
    width = 0.8 / max(1, len(names))
    for ax, which, label in ((tput, 1, "output tokens/s"), (ttft, 2, "mean TTFT (ms)")):
        for i, name in enumerate(names):
            values = [c[which](results["systems"][name]) for c in clients]
            x = np.arange(len(clients)) + (i - (len(names) - 1) / 2) * width
            bars = ax.bar(x, [v or 0 for v in values], width, color=colors[name], label=name)
            annotate_bars(ax, bars, values, fontsize=8)
        ax.set_xticks(np.arange(len(clients)), [c[0] for c in clients])
        ax.set_ylabel(label)
        n = results["config"].get("burst")
        ax.set_title(f"{n} requests sent at once")
        ax.grid(alpha=0.3, axis="y")
        ax.legend()


def plot_slo_load(ax: Any, results: dict[str, Any], colors: dict[str, str]) -> None:
    """SLO load per rate, the 1.0 line, and each system's sustainable rate (dotted)."""
    import matplotlib.transforms as mtransforms

    # Infinite loads (failed requests) are crosses along the top edge.
    top = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    for name, system in results["systems"].items():
        runs = system.get("runs") or []
        finite = [(r["request_rate"], r["slo_load"]) for r in runs if r["slo_load"] is not None]
        color = colors[name]
        if finite:
            ax.plot(*zip(*finite, strict=True), marker="o", color=color, label=name)
        failed = [r["request_rate"] for r in runs if r["slo_load"] is None]
        if failed:
            ax.plot(failed, [0.97] * len(failed), "x", color=color, transform=top, clip_on=False)
        sustainable = system.get("sustainable")
        if not sustainable:
            continue
        if sustainable["rate"] > 0:
            bound = ">= " if sustainable["censored"] else ""
            label = f"{name} sustainable {bound}{sustainable['rate']:.2f} req/s"
            ax.axvline(sustainable["rate"], color=color, linestyle=":", label=label)
            if not sustainable["censored"]:
                ax.plot([sustainable["rate"]], [1.0], "*", color=color, markersize=12)
        else:  # 0 lies left of every tested rate: the legend says it
            ax.plot([], [], " ", label=f"{name} sustainable 0: over at the lowest rate")
    ax.axhline(1.0, color="grey", linestyle="--", label="SLO load 1")
    # Linear, as the interpolation is (the star sits on the segment); an overloaded system's
    # load runs off the top rather than squashing the region around 1.
    loads = [r["slo_load"] for sys_ in results["systems"].values() for r in sys_.get("runs") or []]
    highest = max([load for load in loads if load is not None] + [1.0])
    ax.set_ylim(0.0, min(highest * 1.1, SLO_LOAD_AXIS_MAX))
    cut = f", cut at {SLO_LOAD_AXIS_MAX:g}" if highest * 1.1 > SLO_LOAD_AXIS_MAX else ""
    ax.set_ylabel(f"SLO load: max(TTFT p99 / SLO, TPOT p99 / SLO){cut}")
