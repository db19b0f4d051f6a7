"""The swap series: each step's swapped blocks and bytes become counters, the pool a gauge."""

from __future__ import annotations

from dataclasses import replace

from quire.engine.stats import SwapStats
from services.executor.executor_metrics import ExecutorMetrics
from tests.services.executor.test_metrics import samples, step_stats


def test_swap_counters_and_host_pool_usage() -> None:
    metrics = ExecutorMetrics("quire-tiny")
    out = SwapStats(3, 0, 0, 3 * 1024, 0, host_bytes_used=3 * 1024, host_bytes_capacity=8192)
    back = SwapStats(0, 2, 1, 0, 2 * 1024, host_bytes_used=2048, host_bytes_capacity=8192)
    metrics.observe_step(replace(step_stats(num_sampled=2, num_preempted=1), swap=out))
    metrics.observe_step(replace(step_stats(num_sampled=2, num_preempted=0), swap=back))
    got = samples(metrics)
    assert got["quire_executor_swap_out_blocks_total"] == 3
    assert got["quire_executor_swap_out_bytes_total"] == 3 * 1024
    assert got["quire_executor_swap_in_blocks_total"] == 2
    assert got["quire_executor_swap_in_bytes_total"] == 2 * 1024
    assert got["quire_executor_swap_in_misses_total"] == 1
    assert got["quire_executor_cpu_cache_usage_perc"] == 0.25
    assert got["quire_executor_num_preemptions_total"] == 1


def test_recompute_mode_moves_nothing() -> None:
    metrics = ExecutorMetrics("quire-tiny")
    metrics.observe_step(step_stats(num_sampled=2, num_preempted=1))
    got = samples(metrics)
    assert got["quire_executor_swap_out_blocks_total"] == 0
    assert got["quire_executor_cpu_cache_usage_perc"] == 0
