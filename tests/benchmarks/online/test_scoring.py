"""The online benchmark's scoring: SLO load, sustainable rate, cache hits, per-rate summaries."""

from __future__ import annotations

import math
from typing import Any

import pytest

from benchmarks.common.sse import StreamRecord, Usage
from benchmarks.online.scoring import (
    cache_hit_rate,
    compare,
    slo_load,
    summarize,
    sustainable_rate,
)

SLO_TTFT_MS, SLO_TPOT_MS = 2000.0, 300.0


def run(rate: float, ttft_p99: float | None, tpot_p99: float | None, failed: int = 0) -> dict:
    return {
        "request_rate": rate,
        "failed": failed,
        "ttft_ms": {"p99": ttft_p99},
        "tpot_ms": {"p99": tpot_p99},
    }


def sustainable(runs: list[dict]) -> dict[str, Any]:
    return sustainable_rate(runs, SLO_TTFT_MS, SLO_TPOT_MS)


def test_slo_load_is_the_worse_of_the_two_ratios() -> None:
    assert slo_load(run(1, 1000, 60), SLO_TTFT_MS, SLO_TPOT_MS) == 0.5
    assert slo_load(run(1, 200, 450), SLO_TTFT_MS, SLO_TPOT_MS) == 1.5
    assert math.isinf(slo_load(run(1, 200, 60, failed=1), SLO_TTFT_MS, SLO_TPOT_MS))
    assert math.isinf(slo_load(run(1, 200, None), SLO_TTFT_MS, SLO_TPOT_MS))
    assert math.isinf(slo_load(run(1, None, 60), SLO_TTFT_MS, SLO_TPOT_MS))


def test_sustainable_rate_crosses_on_tpot_while_ttft_stays_low() -> None:
    # TTFT p99 stays far under its SLO (an admit-everything scheduler past capacity), while
    # TPOT's load goes 0.5, 0.8, 2.0: it crosses between 2 and 4 at 2 + 2 * 0.2 / 1.2.
    runs = [run(4, 300, 600), run(1, 100, 150), run(2, 200, 240)]  # unsorted on purpose
    s = sustainable(runs)
    assert not s["censored"]
    assert s["rate"] == pytest.approx(7 / 3)
    assert s["max_rate_under_slo"] == 2


def test_sustainable_rate_interpolates_between_ttft_and_tpot_loads() -> None:
    # Loads 0.9 (TTFT 1800/2000) then 1.9 (TPOT 570/300): crossing at 1 + 0.1 * (3 - 1).
    s = sustainable([run(1, 1800, 150), run(3, 2000, 570), run(5, 3000, 900)])
    assert s == {"rate": pytest.approx(1.2), "censored": False, "max_rate_under_slo": 1}
    s = sustainable([run(1, 100, 150), run(2, 300, 200), run(4, 2200, 100)])
    assert s["rate"] == pytest.approx(2 + 2 * (1 - 2 / 3) / (1.1 - 2 / 3))


def test_sustainable_rate_is_zero_when_the_lowest_rate_fails() -> None:
    s = sustainable([run(0.5, 100, 310), run(1, 100, 400)])
    assert s == {"rate": 0.0, "censored": False, "max_rate_under_slo": 0.0, "below_rate": 0.5}


def test_sustainable_rate_is_censored_when_never_over() -> None:
    # A load of exactly 1.0 meets the SLO.
    s = sustainable([run(1, 100, 150), run(2, 2000, 200), run(4, 1000, 300)])
    assert s == {"rate": 4, "censored": True, "max_rate_under_slo": 4}


def test_sustainable_rate_with_failed_requests_takes_the_failing_rate() -> None:
    # Failures make the load infinite: no interpolation, the crossing rate itself (frac 1).
    s = sustainable([run(1, 100, 150), run(2, 200, 200), run(4, 300, 250, failed=1)])
    assert s == {"rate": 4.0, "censored": False, "max_rate_under_slo": 2}
    s = sustainable([run(1, 100, 150), run(2, 200, None), run(4, 300, 250)])
    assert s == {"rate": 2.0, "censored": False, "max_rate_under_slo": 1}


def record(
    ttft: float = 0.5, e2e: float = 2.5, usage: Usage | None = None, error: str = ""
) -> StreamRecord:
    """A finished 200 stream (with a text chunk at `ttft`) as the client records it."""
    return StreamRecord(
        start=0.0, status=200, ttft=ttft, end=e2e, usage=usage, num_text_chunks=1, error=error
    )


def test_prefix_cache_hit_rate_counts_only_what_the_server_reports() -> None:
    hit = record(usage=Usage(prompt_tokens=100, completion_tokens=1, cached_tokens=64))
    miss = record(usage=Usage(prompt_tokens=50, completion_tokens=1, cached_tokens=0))
    silent = record(usage=Usage(prompt_tokens=70, completion_tokens=1))
    assert cache_hit_rate([hit, miss, silent]) == pytest.approx(64 / 150)
    assert cache_hit_rate([silent]) is None


def test_summarize_stores_slo_load() -> None:
    ok = record(usage=Usage(prompt_tokens=4, completion_tokens=11))  # TPOT 200 ms
    summary = summarize([ok, ok], 3.0, 1.0, SLO_TTFT_MS, SLO_TPOT_MS)
    assert summary["slo_load"] == pytest.approx(2 / 3)
    failed = StreamRecord(start=0.0, status=503, error="HTTP 503: busy")
    summary = summarize([ok, failed], 3.0, 1.0, SLO_TTFT_MS, SLO_TPOT_MS)
    assert summary["slo_load"] is None  # infinite; JSON has no infinity


def system(rate: float, censored: bool, **extra: Any) -> dict[str, Any]:
    return {"status": "ok", "sustainable": {"rate": rate, "censored": censored, **extra}}


def test_rate_ratio_is_exact_when_both_cross() -> None:
    ratio, note = compare(system(3.0, False), system(2.0, False))
    assert (ratio, note) == (1.5, "exact")


def test_a_baseline_over_the_slos_at_every_rate_bounds_the_ratio_from_below() -> None:
    runs = [run(3, 1000, 900), run(4, 1000, 1000)]  # TPOT over at both rates
    assert sustainable(runs)["below_rate"] == 3
    ratio, note = compare(system(4.0, True), system(0.0, False, below_rate=3.0))
    assert ratio is not None and math.isclose(ratio, 4 / 3)
    assert note.startswith("lower bound") and "(3 req/s)" in note


def test_rate_ratio_is_undefined_when_both_are_over_at_the_lowest_rate() -> None:
    over = system(0.0, False, below_rate=1.0)
    ratio, note = compare(over, over)
    assert ratio is None and note.startswith("undefined")
