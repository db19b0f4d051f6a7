"""serving.png: the latency-throughput curves, and latency, throughput and SLO load against rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common.report import pyplot
from benchmarks.online.config import SLO_LOAD_AXIS_MAX

# One colour per system, one line style and marker per dtype, across every panel.
COLORS = {"quire": "C0", "vllm": "C1", "llamacpp": "C2", "transformers": "C3"}
STYLES = {
    "float32": ("-", "o"),
    "bfloat16": ("--", "s"),
    "q4_1": (":", "^"),
    "q8_0": ("-.", "D"),
}


def style(system: dict[str, Any], name: str) -> dict[str, Any]:
    linestyle, marker = STYLES.get(system.get("dtype", ""), ("-", "o"))
    color = COLORS.get(system.get("system", name.split()[0]), "C7")
    return {"color": color, "linestyle": linestyle, "marker": marker}


def plot(results: dict[str, Any], path: Path) -> None:
    """serving.png: a row of curves per client (throughput against concurrency, TTFT and TPOT
    against throughput), then a row against Poisson rate if any were run."""
    plt = pyplot()
    systems = results["systems"]
    clients = [c for c in results["config"].get("clients", []) if curves(systems, c)]
    has_rates = any(s.get("runs") for s in systems.values())
    num_rows = len(clients) + has_rates
    if num_rows == 0:
        return
    fig, grid = plt.subplots(num_rows, 4, figsize=(22, 5.5 * num_rows), squeeze=False)
    for axes, client in zip(grid, clients, strict=False):
        plot_curves(list(axes), systems, client)
    if has_rates:
        plot_rates(list(grid[-1]), results)
    title = f"Serving {results['config']['model']} ({results['config']['dataset']} requests)"
    if results["config"].get("shared_prefix_len", 0) > 0:
        config = results["config"]
        title += (
            f", shared prefix {config['shared_prefix_len']} tokens"
            f" x {config['num_shared_prefixes']} tenants"
        )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def curves(systems: dict[str, Any], client: str) -> dict[str, list[dict[str, Any]]]:
    """Each system's measured points by `client`."""
    out = {}
    for name, system in systems.items():
        points = [p for p in (system.get("curve") or {}).get(client, []) if p.get("completed")]
        if points:
            out[name] = points
    return out


def plot_curves(axes: list[Any], systems: dict[str, Any], client: str) -> None:
    """Output tok/s against concurrency; TTFT and TPOT (p50, p99 faint) against output tok/s."""
    tput, ttft, tpot, legend = axes
    for name, points in curves(systems, client).items():
        look = style(systems[name], name)
        x = [p["concurrency"] for p in points]
        y = [p["output_throughput"] for p in points]
        tput.plot(x, y, label=name, **look)
        for ax, key in ((ttft, "ttft_ms"), (tpot, "tpot_ms")):
            for stat, alpha in (("median", 1.0), ("p99", 0.3)):
                pts = [(p["output_throughput"], p[key][stat]) for p in points if p[key][stat]]
                if pts:
                    ax.plot(*zip(*pts, strict=True), alpha=alpha, **look)
    tput.set_xscale("log", base=2)
    ticks = sorted({p["concurrency"] for pts in curves(systems, client).values() for p in pts})
    tput.set_xticks(ticks, [str(t) for t in ticks])
    tput.minorticks_off()
    tput.set_xlabel("max requests in flight (the last point: all at once)")
    tput.set_ylabel("output tokens/s")
    tput.set_title(f"throughput against concurrency ({client} client)")
    for ax, what in ((ttft, "TTFT"), (tpot, "TPOT")):
        ax.set_yscale("log")
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(f"{what} ms (p50; p99 faint)")
        ax.set_title(f"{what} against throughput ({client} client)")
    for ax in (tput, ttft, tpot):
        ax.grid(alpha=0.3, which="both")
    handles, labels = tput.get_legend_handles_labels()
    legend.axis("off")
    legend.legend(handles, labels, loc="center", fontsize=11)


def plot_rates(axes: list[Any], results: dict[str, Any]) -> None:
    """TTFT p99, TPOT p99 and output tok/s against Poisson rate; the SLO load."""
    systems = results["systems"]
    panels = [
        ("TTFT p99 (ms)", lambda r: r["ttft_ms"]["p99"], results["slo"]["ttft_ms"]),
        ("TPOT p99 (ms)", lambda r: r["tpot_ms"]["p99"], results["slo"]["tpot_ms"]),
        ("output tokens/s", lambda r: r["output_throughput"], None),
    ]
    for ax, (label, get, slo) in zip(axes, panels, strict=False):
        for name, system in systems.items():
            pts = [(r["request_rate"], get(r)) for r in system.get("runs") or [] if get(r)]
            if pts:
                ax.plot(*zip(*pts, strict=True), label=name, **style(system, name))
        if slo is not None:
            ax.axhline(slo, color="grey", linestyle="--", label=f"SLO {slo:g} ms")
        ax.set_ylabel(label)
    plot_slo_load(axes[3], results)
    rates = results["config"]["rates"]
    for ax in axes:
        # Linear in rate, as the sustainable rate's interpolation is.
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.set_xlabel("request rate (req/s, Poisson)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


def plot_slo_load(ax: Any, results: dict[str, Any]) -> None:
    """SLO load per rate, the 1.0 line, and each system's sustainable rate (dotted)."""
    import matplotlib.transforms as mtransforms

    # Infinite loads (failed requests) are crosses along the top edge.
    top = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    for name, system in results["systems"].items():
        runs = system.get("runs") or []
        finite = [(r["request_rate"], r["slo_load"]) for r in runs if r["slo_load"] is not None]
        look = style(system, name)
        color = look["color"]
        if finite:
            ax.plot(*zip(*finite, strict=True), label=name, **look)
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
