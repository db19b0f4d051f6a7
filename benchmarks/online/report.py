"""serving.json, serving.png and the printed table of the online benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common.report import write_json
from benchmarks.online.plot import plot

HEADER = (
    f"{'system':<13}{'rate':>6}{'done':>6}{'req/s':>8}{'tok/s':>8}{'good/s':>8}"
    f"{'TTFT mean/med/p99 ms':>24}{'TPOT mean/med/p99 ms':>24}{'ITL p99':>9}{'load':>7}"
)


def row(name: str, run: dict[str, Any]) -> str:
    """One printed table row: a run of one system at one rate (or the burst)."""
    rate = run["request_rate"]

    def triple(s: dict[str, float | None]) -> str:
        return "/".join("-" if s[k] is None else f"{s[k]:.0f}" for k in ("mean", "median", "p99"))

    itl, load = run["itl_ms"]["p99"], run["slo_load"]
    return (
        f"{name:<13}{'burst' if rate is None else f'{rate:g}':>6}{run['completed']:>6}"
        f"{run['request_throughput']:>8.2f}{run['output_throughput']:>8.1f}{run['goodput']:>8.2f}"
        f"{triple(run['ttft_ms']):>24}{triple(run['tpot_ms']):>24}"
        f"{'-' if itl is None else f'{itl:.0f}':>9}{'inf' if load is None else f'{load:.2f}':>7}"
    )


def report(results: dict[str, Any], out: Path) -> None:
    """Write serving.json and serving.png to `out` and print the table."""
    slo = results["slo"]
    write_json(out / "serving.json", results)
    plot(results, out / "serving.png")
    print()
    print(f"SLO: TTFT <= {slo['ttft_ms']:g} ms, TPOT <= {slo['tpot_ms']:g} ms")
    print(HEADER)
    for name, system in results["systems"].items():
        if system.get("status") != "ok":
            print(f"{name:<13}{system['status']}: {system.get('reason', '')[:200]}")
            continue
        for run in [system.get("burst"), *system["runs"]]:
            if run is not None:
                print(row(name, run))
    for name, system in results["systems"].items():
        if system.get("status") == "ok":
            s = system["sustainable"]
            bound = ">= " if s["censored"] else ""
            rate = f"{bound}{s['rate']:.2f}"
            if s.get("below_rate"):  # over the SLOs already at the lowest tested rate
                rate = f"< {s['below_rate']:.2f}"
            print(
                f"{name}: sustainable rate (SLO load = max(TTFT p99 / {slo['ttft_ms']:g} ms, "
                f"TPOT p99 / {slo['tpot_ms']:g} ms) <= 1) {rate} req/s; "
                f"highest tested rate under it {s['max_rate_under_slo']:g}"
            )
    for name, system in results["systems"].items():
        client = system.get("vllm_client") or {}
        if client.get("status") == "ok":
            print(
                f"{name}: vLLM's client, {client['num_prompts']} at once: "
                f"{client['output_throughput']:.1f} output tok/s, TTFT mean "
                f"{client['mean_ttft_ms']:.0f} ms, TPOT mean {client['mean_tpot_ms']:.0f} ms"
            )
        elif client:
            print(f"{name}: vLLM's client {client['status']}: {client.get('reason', '')[:300]}")

    def shown(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    for peer, r in results.get("ratios", {}).items():
        print(
            f"quire / {peer}: sustainable rate {shown(r['sustainable_rate'])} "
            f"({r['sustainable_rate_note']}); burst output throughput "
            f"{shown(r['burst_output_throughput'])}; vLLM's client output throughput "
            f"{shown(r['vllm_client_output_throughput'])}"
        )
    ratio, ratio_note = results["sustainable_rate_ratio"], results["sustainable_rate_ratio_note"]
    main_peer = results["config"].get("main_peer") or "baseline"
    print(f"sustainable rate ratio quire / {main_peer}: {shown(ratio)} ({ratio_note})")
    check = results.get("sampling_check") or {}
    if check.get("status") == "ok":
        print(
            f"ShareGPT sampling vs vLLM's own sampler: {check['num_requests']} requests, "
            f"{'identical' if check['identical'] else str(check['num_mismatches']) + ' differ'}"
        )
    print(f"wrote {out / 'serving.json'} and {out / 'serving.png'}")
