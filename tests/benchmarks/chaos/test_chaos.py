"""Bounded chaos: each fault on its own small stack under light load (make chaos runs long).

Every scenario must end with no hung request, no accepted request lost and no KV block left
in use once the cluster is idle.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.chaos import migration
from benchmarks.chaos.faults import FAULTS
from benchmarks.chaos.migration import MIGRATION_FAULTS
from benchmarks.chaos.pressure import overload, soak
from benchmarks.chaos.stack import REPO, Plan, make_config, on_stack, start_process, with_stack
from services.stack.runner import Stack

# Small counts: the whole module stays within ~110 s on two cores.
PLAN = Plan(
    concurrency=3,
    before_s=0.8,
    after_s=1.6,
    soak_requests=24,
    overload_s=2.0,
    unloaded_samples=6,
)


def shown(result: dict[str, Any]) -> str:
    """The whole result, for a failed assertion's message (pytest would shorten a dict)."""
    return json.dumps(result, default=str)


def assert_clean(result: dict[str, Any]) -> None:
    assert result["sent"] > 0
    assert result["hung"] == 0, shown(result)
    assert result["lost"] == 0, shown(result)
    assert result["blocks_leaked"] == 0, shown(result)
    assert result["completed"] > 0, shown(result)


@pytest.fixture(scope="module")
def whole_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack for the faults that leave it whole (each starts again what it killed)."""
    stack = Stack(make_config(), tmp_path_factory.mktemp("chaos"), cwd=REPO)
    stack.start(120.0)
    try:
        yield stack
    finally:
        stack.stop()


# The pull faults' stack: pulls taken whatever the tiny model's costs (the chaos CLI does the
# same), the router's stall bound cut to 1.5 s and a pull's deadline to 1 s (the stall bound must
# exceed it: a pull holds a step), and an executor given up routable again 1 s after it answers.
PULL_FAULT_ENV = {
    "QUIRE_PULL_POLICY": "always",
    "QUIRE_EXECUTOR_STALL_S": "1.5",
    "QUIRE_PULL_TIMEOUT_S": "1.0",
    "QUIRE_EXECUTOR_DOWN_S": "1.0",
}


@pytest.fixture(scope="module")
def pull_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack for the faults that freeze an executor and let it go on (each leaves it whole)."""
    stack = Stack(make_config(), tmp_path_factory.mktemp("pulls"), cwd=REPO)
    for name, spec in stack.specs.items():
        stack.specs[name] = dataclasses.replace(spec, env={**spec.env, **PULL_FAULT_ENV})
    stack.start(120.0)
    try:
        yield stack
    finally:
        stack.stop()


def run_on_whole_stack(name: str, stack: Stack) -> dict[str, Any]:
    return asyncio.run(on_stack(stack, lambda s: FAULTS[name](s, PLAN)))


def test_kill_executor_reroutes_and_restart_serves_again(whole_stack: Stack) -> None:
    result = run_on_whole_stack("kill_executor", whole_stack)
    assert_clean(result)
    assert result["routed_to_dead_after_2s"] == 0
    assert result["new_epoch"]
    assert result["served_after_restart"] > 0


def test_kill_memory_manager_executors_reregister(whole_stack: Stack) -> None:
    result = run_on_whole_stack("kill_memory_manager", whole_stack)
    assert_clean(result)
    assert result["reregistered"] == ["executor-0", "executor-1"]
    assert result["completed_after_restart"] > 0


def test_restart_redis_fails_nothing_and_republishes(whole_stack: Stack) -> None:
    result = run_on_whole_stack("restart_redis", whole_stack)
    assert_clean(result)
    assert result["failed_clean"] == 0
    assert result["prefix_sets_republished"] == ["executor-0", "executor-1"]


def test_rolling_update_loses_nothing(whole_stack: Stack) -> None:
    result = run_on_whole_stack("rolling_update", whole_stack)
    assert_clean(result)
    assert result["executor_exit"] == 0
    # whole again for the next fault: the drained executor starts again
    asyncio.run(start_process(whole_stack, "executor-1", 90.0))


@pytest.mark.slow
def test_soak_frees_every_block(tmp_path: Path) -> None:
    config = make_config(num_kv_blocks=24)
    result = asyncio.run(with_stack(config, tmp_path, lambda s: soak(s, PLAN)))
    assert_clean(result)
    for pool in result["pools"].values():
        assert pool["used"] == 0 and pool["consistent"], pool
        assert pool["total"] == pool["free"] + pool["cached"], pool
    assert result["dead_executor_record_gone"]


def test_overload_refuses_with_429_and_loses_nothing(tmp_path: Path) -> None:
    config = make_config(max_pending_per_executor=2, max_pending_total=4)
    result = asyncio.run(with_stack(config, tmp_path, lambda s: overload(s, PLAN)))
    assert_clean(result)
    # Arrivals at ten times the rate the bound sustained a moment before: some are refused,
    # and every refusal is a 429. (How many depends on how busy the machine is between the
    # two phases, so the share is `make chaos`'s figure, not a check.)
    assert result["rejected_429"] > 0, shown(result)
    assert result["failed_clean"] == result["rejected_429"], shown(result)
    assert result["admission_bound"] == 4


def test_a_frozen_pull_source_means_the_follow_up_computes(pull_stack: Stack) -> None:
    result = asyncio.run(on_stack(pull_stack, lambda s: FAULTS["stop_pull_source"](s, PLAN)))
    assert_clean(result)
    # It tried the frozen source and gave up; a load request that wanted the same source
    # while it was frozen (or left alone after its timeout) computed too. That a timed-out
    # source is tried once and then left alone is tests/services/executor/test_block_transfer.py's.
    assert result["pull_fallbacks"] >= 1
    assert result["follow_up_completed"] == 1 and result["follow_up_cached_tokens"] == 0


def test_a_paused_executor_is_given_up_and_its_streams_continue_elsewhere(
    pull_stack: Stack,
) -> None:
    """SIGSTOP mid-stream: the router's stall watch gives up on the executor and every stream
    on it continues on the other, token for token. The other executor's pulls from the frozen
    one give up within their deadline, after which it computes."""
    plan = dataclasses.replace(PLAN, concurrency=4, fault_rounds=1)
    result = asyncio.run(
        on_stack(
            pull_stack,
            lambda s: migration.run_fault(s, plan, MIGRATION_FAULTS["migrate_pause"], seed=3),
        )
    )
    assert migration.failures(result) == [], shown(result)
    assert result["mismatched_migrated"] == 0 and result["blocks_leaked"] == 0, shown(result)
