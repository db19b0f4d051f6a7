"""Pulls on and off through the routing benchmark: its stacks, the simulation's pull rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.routing.main import parse_args, stack_config
from benchmarks.routing.summary import variant
from benchmarks.routing_sim.main import PULL_S_PER_TOKEN, load_pull_rate


def test_each_run_turns_pulls_on_or_off_in_executors_and_router_alike() -> None:
    args = parse_args([])
    assert args.pulls == "on,off"
    on = stack_config(args, "round-robin", "on", 240)
    off = stack_config(args, "round-robin", "off", 240)
    assert (on.executor_enable_pulls, on.router_routing_pulls) == (True, True)
    assert (off.executor_enable_pulls, off.router_routing_pulls) == (False, False)
    assert on.num_kv_blocks == off.num_kv_blocks == 240
    assert on.routing_policy == "round-robin"
    assert (variant("prefix", "on"), variant("prefix", "off")) == (
        "prefix/pulls",
        "prefix/no-pulls",
    )


def test_the_pull_rate_comes_from_bench_pulls(tmp_path: Path) -> None:
    assert load_pull_rate(tmp_path / "absent.json")[0] == PULL_S_PER_TOKEN
    path = tmp_path / "pulls.json"
    rows = [{"pull_ms_per_token": ms} for ms in (0.3, 0.1, 0.2)]
    path.write_text(json.dumps({"summary": rows}))
    assert load_pull_rate(path) == (pytest.approx(0.2e-3), str(path))
