"""Synthetic request lengths: lognormal draws with a given mean, rounded and clamped.

The benchmarks draw whole arrays from a numpy generator; the load test draws one length at a
time from its per-user `random.Random`. Both parameterize the distribution by its mean (not
its median), which is what a dataset's published average length is.
"""

from __future__ import annotations

import math
import random

import numpy as np


def lognormal_mu(mean: float, sigma: float) -> float:
    """The mu for which lognormal(mu, sigma) has mean `mean`."""
    return math.log(mean) - sigma * sigma / 2


def lognormal_lengths(
    rng: np.random.Generator,
    mean: float,
    sigma: float,
    n: int,
    low: int = 1,
    high: int | None = None,
) -> np.ndarray:
    """n lognormal draws with mean `mean`, rounded to even and clamped to [low, high]."""
    values = rng.lognormal(lognormal_mu(mean, sigma), sigma, size=n)
    return np.clip(np.rint(values), low, high).astype(np.int64)


def lognormal_length(rng: random.Random, mean: float, sigma: float, low: int, high: int) -> int:
    """One lognormal draw with mean `mean`, rounded to even and clamped to [low, high]."""
    return max(low, min(high, round(rng.lognormvariate(lognormal_mu(mean, sigma), sigma))))
