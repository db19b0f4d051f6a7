"""One run's figures from its outcomes, and the targets the multi-turn and long-context runs
are held to."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.common.sse import StreamRecord


def _ms(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values) * 1000.0, q)) if values else None


def summarize(outcomes: Sequence[StreamRecord], duration_s: float) -> dict[str, Any]:
    """TTFT p50/p99, TPOT p99, output throughput, hit rate and who served what."""
    ok = [o for o in outcomes if o.ok]
    ttft = [o.ttft for o in ok if o.ttft is not None]
    tpot = [t for o in ok if (t := o.tpot) is not None]
    prompt = sum(o.prompt_tokens for o in ok)
    cached = sum(o.cached_tokens or 0 for o in ok)
    output = sum(o.output_tokens for o in ok)
    return {
        "num_requests": len(outcomes),
        "num_failed": len(outcomes) - len(ok),
        "errors": sorted({o.failure for o in outcomes if not o.ok})[:5],
        "duration_s": duration_s,
        "ttft_p50_ms": _ms(ttft, 50),
        "ttft_p99_ms": _ms(ttft, 99),
        "tpot_p99_ms": _ms(tpot, 99),
        "output_tok_s": output / duration_s if duration_s > 0 else None,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else None,
        "requests_per_executor": dict(sorted(Counter(o.executor for o in ok).items())),
    }


PULLS = ("on", "off")  # executors pull a peer's blocks (and the router counts them), or not


def variant(policy: str, pulls: str) -> str:
    """The key of one run in the results: "prefix/pulls", "round-robin/no-pulls"."""
    return f"{policy}/{'pulls' if pulls == 'on' else 'no-pulls'}"


def _ratio(
    runs: dict[str, dict[str, Any]], a: str, b: str, key: str, target: str, bound: float
) -> dict[str, Any] | None:
    """runs[a][key] / runs[b][key] against `target` ("<= x" or ">= x", x = `bound`); None
    where a run or its figure is missing. The measured ratio, never rounded."""
    if a not in runs or b not in runs or not runs[a][key] or not runs[b][key]:
        return None
    value = runs[a][key] / runs[b][key]
    met = value <= bound if target.startswith("<=") else value >= bound
    return {"value": value, "target": target, "met": met, "of": f"{a} / {b}"}


def _kept(found: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    return {k: v for k, v in found.items() if v is not None}


def _hit_share(run: dict[str, Any] | None, oracle: float, bound: float) -> dict[str, Any] | None:
    if not run or run["hit_rate"] is None or not oracle:
        return None
    share = run["hit_rate"] / oracle
    return {"value": share, "target": f">= {bound}", "met": share >= bound}


def targets(
    policies: dict[str, dict[str, Any]], oracle: float, pulls: str = "on"
) -> dict[str, Any]:
    """The multi-turn targets, every policy with `pulls`: prefix TTFT p50 <= 0.5x
    round-robin's, hit rate >= 90% of the oracle, output throughput within 5% of
    least-loaded's or better. Left out where a run is missing."""
    prefix, rr, ll = (variant(p, pulls) for p in ("prefix", "round-robin", "least-loaded"))
    return _kept(
        {
            "ttft_p50_vs_round_robin": _ratio(policies, prefix, rr, "ttft_p50_ms", "<= 0.5", 0.5),
            "hit_rate_vs_oracle": _hit_share(policies.get(prefix), oracle, 0.9),
            "throughput_vs_least_loaded": _ratio(
                policies, prefix, ll, "output_tok_s", ">= 0.95", 0.95
            ),
        }
    )


def long_context_targets(policies: dict[str, dict[str, Any]], oracle: float) -> dict[str, Any]:
    """The long-context targets: prefix with pulls' TTFT p50 <= 0.5x round-robin without;
    round-robin with pulls <= 0.7x round-robin without; prefix with pulls' hit rate (local +
    pulled) >= 95% of the oracle; its output throughput >= least-loaded's (the better of
    least-loaded's two runs). Left out where a run is missing."""
    prefix = variant("prefix", "on")
    rr_on, rr_off = variant("round-robin", "on"), variant("round-robin", "off")
    ll = [variant("least-loaded", p) for p in PULLS if variant("least-loaded", p) in policies]
    best_ll = max(ll, key=lambda k: policies[k]["output_tok_s"] or 0.0) if ll else ""
    return _kept(
        {
            "ttft_p50_prefix_pulls_vs_round_robin_no_pulls": _ratio(
                policies, prefix, rr_off, "ttft_p50_ms", "<= 0.5", 0.5
            ),
            "ttft_p50_round_robin_pulls_vs_no_pulls": _ratio(
                policies, rr_on, rr_off, "ttft_p50_ms", "<= 0.7", 0.7
            ),
            "hit_rate_vs_oracle": _hit_share(policies.get(prefix), oracle, 0.95),
            "throughput_vs_least_loaded": _ratio(
                policies, prefix, best_ll, "output_tok_s", ">= 1.0", 1.0
            ),
        }
    )
