"""quire_tools.workloads.lengths: the mean is the mean (not the median), caps hold for both draws."""

from __future__ import annotations

import random

import numpy as np
from quire_tools.workloads.lengths import lognormal_length, lognormal_lengths


def test_array_draws_keep_the_mean_and_the_caps() -> None:
    lengths = lognormal_lengths(np.random.default_rng(0), 161, 0.9, 50_000)
    assert lengths.dtype == np.int64 and lengths.min() >= 1
    assert abs(lengths.mean() - 161) < 161 * 0.03
    capped = lognormal_lengths(np.random.default_rng(1), 338, 0.8, 2_000, 4, 64)
    assert capped.min() >= 4 and capped.max() == 64


def test_one_draw_at_a_time_matches_the_array_rule() -> None:
    rng = random.Random(0)
    samples = [lognormal_length(rng, 161, 0.9, 1, 100_000) for _ in range(50_000)]
    assert abs(sum(samples) / len(samples) - 161) < 161 * 0.03
    assert all(4 <= lognormal_length(rng, 338, 0.8, 4, 64) <= 64 for _ in range(2_000))
