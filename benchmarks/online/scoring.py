"""Judging runs: per-rate summaries, SLO load, sustainable rate and Quire's ratios to each peer."""

from __future__ import annotations

import math
from typing import Any

from benchmarks.common.sse import StreamRecord
from benchmarks.common.stats import finite_or_none, stats_ms

DEFINITIONS = {
    "ttft_ms": "request sent to its first non-empty text chunk",
    "itl_ms": "every gap between consecutive non-empty text chunks of a request",
    "tpot_ms": "(e2e - ttft) / (output_tokens - 1), requests with more than one token",
    "e2el_ms": "request sent to its last chunk",
    "request_throughput": "completed requests / seconds from the first send to the last finish",
    "output_throughput": "output tokens (stream usage) / the same seconds",
    "prefix_cache_hit_rate": "prompt tokens the server reports as prefix-cache hits (usage."
    "prompt_tokens_details.cached_tokens) / prompt tokens; null when it does not report them",
    "goodput": "completed requests with TTFT <= slo_ttft_ms and TPOT <= slo_tpot_ms, per second",
    "slo_load": "per rate, max(TTFT p99 / slo_ttft_ms, TPOT p99 / slo_tpot_ms); infinite (null "
    "in the JSON) when any request failed or a p99 is missing; <= 1 means both SLOs are met",
    "sustainable_rate": "the request rate at which slo_load crosses 1.0, linearly interpolated "
    "in slo_load between the first tested rate over 1 and the rate before it (that rate itself "
    "if its load is infinite); the highest tested rate (a lower bound, censored=true) if it "
    "never crosses; 0 if it is over at the lowest rate. Both SLOs are the same for both systems",
    "max_rate_under_slo": "the highest tested rate whose slo_load is <= 1 (and every lower tested "
    "rate's too)",
    "sustainable_rate_ratio": "Quire sustainable_rate / baseline sustainable_rate: how much more "
    "load Quire sustains at the same TTFT p99 and TPOT p99 targets; "
    "sustainable_rate_note says when it is only a bound",
    "max_concurrency": "a curve point: requests sent in order with at most this many in flight, "
    "each next one when one finishes (null: all of the point's requests at once)",
    "curve ratios": "per dtype, per peer, per client and point, Quire against the peer in the same "
    "dtype in the same run: output_throughput = Quire / peer, ttft_p50 and tpot_p50 = peer / "
    "Quire (medians); above 1 means Quire is ahead",
}


def slo_load(run: dict[str, Any], slo_ttft_ms: float, slo_tpot_ms: float) -> float:
    """max(TTFT p99 / its SLO, TPOT p99 / its SLO); inf if a request failed or a p99 is missing."""
    ttft, tpot = run["ttft_ms"]["p99"], run["tpot_ms"]["p99"]
    if run["failed"] or ttft is None or tpot is None:
        return math.inf
    return max(float(ttft) / slo_ttft_ms, float(tpot) / slo_tpot_ms)


def cache_hit_rate(results: list[StreamRecord]) -> float | None:
    """Prompt tokens served from the prefix cache / prompt tokens (None if not reported)."""
    reported = [r for r in results if r.cached_tokens is not None]
    total = sum(r.prompt_tokens for r in reported)
    if not reported or not total:
        return None
    return sum(r.cached_tokens or 0 for r in reported) / total


def summarize(
    results: list[StreamRecord],
    duration: float,
    rate: float,
    slo_ttft_ms: float,
    slo_tpot_ms: float,
) -> dict[str, Any]:
    """One run's figures as `vllm bench serve` reports them, its goodput and SLO load."""
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]  # every ok record has one
    tpots = [t for r in ok if (t := r.tpot) is not None]
    good = [
        r
        for r in ok
        if r.ttft is not None
        and r.ttft * 1000 <= slo_ttft_ms
        and (r.tpot is None or r.tpot * 1000 <= slo_tpot_ms)
    ]
    output_tokens = sum(r.output_tokens for r in ok)
    errors = sorted({r.failure for r in results if not r.ok})
    run = {
        "request_rate": None if math.isinf(rate) else rate,  # None: all at once
        "num_prompts": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": errors[:5],
        "duration_s": duration,
        "total_output_tokens": output_tokens,
        "total_prompt_tokens": sum(r.prompt_tokens for r in ok),
        "prefix_cache_hit_rate": cache_hit_rate(ok),
        "request_throughput": len(ok) / duration,
        "output_throughput": output_tokens / duration,
        "goodput": len(good) / duration,
        "ttft_ms": stats_ms(ttfts),
        "tpot_ms": stats_ms(tpots),
        "itl_ms": stats_ms([g for r in ok for g in r.itl]),
        "e2el_ms": stats_ms([e2e for r in ok if (e2e := r.e2e) is not None]),
    }
    load = slo_load(run, slo_ttft_ms, slo_tpot_ms)
    run["slo_load"] = finite_or_none(load)
    return run


def sustainable_rate(
    runs: list[dict[str, Any]], slo_ttft_ms: float, slo_tpot_ms: float
) -> dict[str, Any]:
    """Where the SLO load crosses 1.0 (see DEFINITIONS)."""

    def load(run: dict[str, Any]) -> float:
        return slo_load(run, slo_ttft_ms, slo_tpot_ms)

    runs = sorted(runs, key=lambda r: r["request_rate"])
    below = 0.0
    max_under = 0.0
    for i, run in enumerate(runs):
        if load(run) > 1.0:
            if i == 0:  # over already at the lowest rate: the sustainable one is below it
                return {
                    "rate": 0.0,
                    "censored": False,
                    "max_rate_under_slo": 0.0,
                    "below_rate": run["request_rate"],
                }
            prev = runs[i - 1]
            lo, hi = load(prev), load(run)
            frac = 1.0 if math.isinf(hi) else (1.0 - lo) / (hi - lo)
            rate = prev["request_rate"] + frac * (run["request_rate"] - prev["request_rate"])
            return {"rate": rate, "censored": False, "max_rate_under_slo": max_under}
        below = max_under = run["request_rate"]
    return {"rate": below, "censored": True, "max_rate_under_slo": max_under}


def compare(q: dict[str, Any], b: dict[str, Any]) -> tuple[float | None, str]:
    """Quire's sustainable rate over a baseline's (each a system of serving.json), and what kind
    of number that is."""
    rate_ratio: float | None = None
    ratio_note = "needs both systems"
    if q.get("status") != "ok" or b.get("status") != "ok":
        return rate_ratio, ratio_note
    qs, bs = q.get("sustainable"), b.get("sustainable")
    if qs is None or bs is None:
        return rate_ratio, "no request rates were run"
    if bs["rate"] > 0:
        rate_ratio = qs["rate"] / bs["rate"]
        ratio_note = "exact"
        if qs["censored"] and not bs["censored"]:
            ratio_note = (
                "lower bound: Quire's SLO load stayed <= 1 at every tested rate, so its "
                "sustainable rate is at least the highest one; raise --rates"
            )
        elif bs["censored"] and not qs["censored"]:
            ratio_note = "upper bound: the baseline's SLO load stayed <= 1 at every tested rate"
        elif qs["censored"] and bs["censored"]:
            ratio_note = (
                "not a measurement: both systems' SLO load stayed <= 1 at every tested "
                "rate; raise --rates"
            )
    elif qs["rate"] > 0 and bs.get("below_rate"):
        rate_ratio = qs["rate"] / bs["below_rate"]
        ratio_note = (
            "lower bound: the baseline's SLO load is over 1 already at the lowest tested "
            f"rate ({bs['below_rate']:g} req/s), so its sustainable rate is below that"
        )
    else:
        ratio_note = (
            "undefined: the baseline's SLO load is over 1 at the lowest tested rate; lower --rates"
        )
    return rate_ratio, ratio_note
