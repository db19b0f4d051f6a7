"""serving.json, serving.png and the printed table of the online benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common.report import write_json
from benchmarks.online.plot import plot

HEADER = (
    f"{'system':<20}{'rate':>6}{'done':>6}{'req/s':>8}{'tok/s':>8}{'good/s':>8}"
    f"{'TTFT mean/med/p99 ms':>24}{'TPOT mean/med/p99 ms':>24}{'ITL p99':>9}{'load':>7}"
)
CURVE_HEADER = (
    f"{'system':<20}{'client':>7}{'conc':>6}{'done':>6}{'req/s':>8}{'tok/s':>8}"
    f"{'TTFT p50/p99 ms':>18}{'TPOT p50/p99 ms':>18}{'ITL p99':>9}"
)
RATIO_HEADER = (
    f"{'dtype':<10}{'peer':<14}{'client':<8}{'conc':>6}{'tok/s':>9}{'TTFT p50':>10}{'TPOT p50':>10}"
)


def shown(value: float | None, fmt: str = ".0f") -> str:
    return "-" if value is None else format(value, fmt)


def last_line(text: str, width: int = 200) -> str:
    """The last non-blank line of a failure's reason (a log tail ends with the error)."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip()[:width] if lines else ""


def row(name: str, run: dict[str, Any]) -> str:
    """One printed table row: a run of one system at one Poisson rate."""

    def triple(s: dict[str, float | None]) -> str:
        return "/".join(shown(s[k]) for k in ("mean", "median", "p99"))

    load = run["slo_load"]
    return (
        f"{name:<20}{run['request_rate']:>6g}{run['completed']:>6}"
        f"{run['request_throughput']:>8.2f}{run['output_throughput']:>8.1f}{run['goodput']:>8.2f}"
        f"{triple(run['ttft_ms']):>24}{triple(run['tpot_ms']):>24}"
        f"{shown(run['itl_ms']['p99']):>9}{'inf' if load is None else f'{load:.2f}':>7}"
    )


def curve_row(name: str, point: dict[str, Any]) -> str:
    """One printed table row: one point of one system's curve by one client."""
    c = point["max_concurrency"]
    head = f"{name:<20}{point['client']:>7}{'all' if c is None else c:>6}"
    if "completed" not in point:  # the client itself failed
        return f"{head}  {point['status']}: {last_line(point.get('reason', ''))}"

    def pair(s: dict[str, float | None]) -> str:
        return f"{shown(s['median'])}/{shown(s['p99'])}"

    line = (
        f"{head}{point['completed']:>6}{point['request_throughput']:>8.2f}"
        f"{point['output_throughput']:>8.1f}{pair(point['ttft_ms']):>18}"
        f"{pair(point['tpot_ms']):>18}{shown(point['itl_ms']['p99']):>9}"
    )
    if point["status"] != "ok":
        line += f"  {point['status']}: {last_line(point.get('reason', ''), 120)}"
    if not point.get("output_tokens_as_expected", True):
        line += f"  (output tokens {point['total_output_tokens']}, "
        line += f"expected {point['expected_output_tokens']})"
    return line


def ratio_rows(results: dict[str, Any]) -> list[str]:
    """The same-run ratios, a row per dtype, peer, client and point."""
    lines = []
    for dtype, peers in results.get("ratios", {}).items():
        for peer, r in peers.items():
            for client, points in r["curve"].items():
                for p in points:
                    c = p["max_concurrency"]
                    lines.append(
                        f"{dtype:<10}{peer:<14}{client:<8}{'all' if c is None else c:>6}"
                        f"{shown(p['output_throughput'], '.3f'):>9}"
                        f"{shown(p['ttft_p50'], '.3f'):>10}{shown(p['tpot_p50'], '.3f'):>10}"
                    )
    return lines


def report(results: dict[str, Any], out: Path) -> None:
    """Write serving.json and serving.png to `out` and print the tables."""
    slo = results["slo"]
    write_json(out / "serving.json", results)
    plot(results, out / "serving.png")
    systems = results["systems"]
    print()
    if any(s.get("curve") for s in systems.values()):
        print("The curve: max requests in flight per point (all: every request at once)")
        print(CURVE_HEADER)
        for name, system in systems.items():
            for points in (system.get("curve") or {}).values():
                for point in points:
                    print(curve_row(name, point))
    for name, system in systems.items():
        if system.get("status") != "ok":
            print(f"{name:<20}{system['status']}: {last_line(system.get('reason', ''), 300)}")
    lines = ratio_rows(results)
    if lines:
        print()
        print("Same-run ratios, Quire against each peer in the same dtype (above 1: Quire ahead;")
        print("tok/s = Quire / peer output throughput, TTFT p50 and TPOT p50 = peer / Quire):")
        print(RATIO_HEADER)
        print("\n".join(lines))
    rated = {n: s for n, s in systems.items() if s.get("status") == "ok" and s.get("runs")}
    if rated:
        print()
        print(f"Poisson rates; SLO: TTFT <= {slo['ttft_ms']:g} ms, TPOT <= {slo['tpot_ms']:g} ms")
        print(HEADER)
        for name, system in rated.items():
            for run in system["runs"]:
                print(row(name, run))
    for name, system in rated.items():
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
    for dtype, peers in results.get("ratios", {}).items():
        for peer, r in peers.items():
            if results["config"].get("rates"):
                print(
                    f"sustainable rate ratio quire / {peer} {dtype}: "
                    f"{shown(r['sustainable_rate'], '.3f')} ({r['sustainable_rate_note']})"
                )
    check = results.get("sampling_check") or {}
    if check.get("status") == "ok":
        print(
            f"ShareGPT sampling vs vLLM's own sampler: {check['num_requests']} requests, "
            f"{'identical' if check['identical'] else str(check['num_mismatches']) + ' differ'}"
        )
    print(f"wrote {out / 'serving.json'} and {out / 'serving.png'}")
