"""One policy's figures from its outcomes, and the targets the multi-turn run is held to."""

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


def targets(policies: dict[str, dict[str, Any]], oracle: float) -> dict[str, Any]:
    """The multi-turn targets: prefix TTFT p50 <= 0.5x round-robin's, hit rate >= 90% of the
    oracle, output throughput within 5% of least-loaded's or better. None where a policy is
    missing from the run."""
    prefix = policies.get("prefix")
    rr = policies.get("round-robin")
    ll = policies.get("least-loaded")
    out: dict[str, Any] = {}
    if prefix and rr and prefix["ttft_p50_ms"] and rr["ttft_p50_ms"]:
        ratio = prefix["ttft_p50_ms"] / rr["ttft_p50_ms"]
        out["ttft_p50_vs_round_robin"] = {"value": ratio, "target": "<= 0.5", "met": ratio <= 0.5}
    if prefix and prefix["hit_rate"] is not None and oracle:
        share = prefix["hit_rate"] / oracle
        out["hit_rate_vs_oracle"] = {"value": share, "target": ">= 0.9", "met": share >= 0.9}
    if prefix and ll and prefix["output_tok_s"] and ll["output_tok_s"]:
        ratio = prefix["output_tok_s"] / ll["output_tok_s"]
        out["throughput_vs_least_loaded"] = {
            "value": ratio,
            "target": ">= 0.95",
            "met": ratio >= 0.95,
        }
    return out
