"""The statistics every benchmark reports: percentiles, latency summaries, time-weighted means,
length summaries and ratios. Plain functions of lists; no benchmark state."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 1]; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def stats_ms(values: Sequence[float]) -> dict[str, float | None]:
    """Mean, median and p99 (numpy's interpolated percentile) of seconds, in milliseconds."""
    if not values:
        return {"mean": None, "median": None, "p99": None}
    a = np.asarray(values) * 1000.0
    return {
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "p99": float(np.percentile(a, 99)),
    }


def time_weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """The mean of `values`, each weighted by its duration; the plain mean if none has any."""
    w = np.array(weights, dtype=float)
    v = np.array(values, dtype=float)
    if w.sum() <= 0:
        return float(v.mean())
    return float((w * v).sum() / w.sum())


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    """Mean, p50, p90, min, max and total of token counts."""
    a = np.asarray(lengths)
    return {
        "mean": float(a.mean()),
        "p50": float(np.median(a)),
        "p90": float(np.percentile(a, 90)),
        "min": int(a.min()),
        "max": int(a.max()),
        "total": int(a.sum()),
    }


def length_summary(lengths: Sequence[int]) -> dict[str, float] | None:
    """Mean, max and total of token counts; None for no requests."""
    if not lengths:
        return None
    stats = length_stats(lengths)
    return {key: stats[key] for key in ("mean", "max", "total")}


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is 0."""
    return a / b if a is not None and b else None


def finite_or_none(value: float) -> float | None:
    """JSON has no infinity: an infinite figure is written as null."""
    return None if math.isinf(value) else value


def number_at(tree: Any, *path: str) -> float | None:
    """The number at `path` in nested dicts, or None where a key or the number is missing."""
    value = tree
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, int | float) else None
