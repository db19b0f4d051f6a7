"""benchmarks.chaos.compose without Docker: its verdicts on a report and its command line."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.chaos import compose as chaos_compose
from benchmarks.chaos.cli import failures


def clean_fault(**extra: Any) -> dict[str, Any]:
    return {
        "sent": 10,
        "completed": 9,
        "failed_clean": 1,
        "hung": 0,
        "lost": 0,
        "disconnected": 0,
        "blocks_leaked": 0,
        "manager_pools_consistent": True,
        **extra,
    }


def test_a_clean_report_passes_both_verdicts() -> None:
    report = {
        "faults": {name: clean_fault(routed_to_dead_after_2s=0) for name in chaos_compose.FAULTS}
    }
    assert failures(report) == []
    assert chaos_compose.routing_failures(report) == []


def test_each_broken_promise_is_named() -> None:
    report = {
        "faults": {
            "kill_executor": clean_fault(routed_to_dead_after_2s=2),
            "pause_redis": clean_fault(completed=0),
            "restart_memory_manager": clean_fault(manager_pools_consistent=False, hung=1),
            "disconnect_executor": clean_fault(blocks_leaked=3),
        }
    }
    assert chaos_compose.routing_failures(report) == [
        "kill_executor: routed_to_dead_after_2s=2",
        "pause_redis: nothing completed",
        "restart_memory_manager: the memory manager's block states disagree with its counters",
    ]
    assert failures(report) == [
        "restart_memory_manager: hung=1",
        "disconnect_executor: blocks_leaked=3",
    ]


def test_the_load_asks_for_the_compose_model() -> None:
    load = chaos_compose.ComposeLoad(["http://127.0.0.1:1"], seed=3)
    assert {load.pick()["body"]["model"] for _ in range(20)} == {chaos_compose.MODEL}


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        chaos_compose.main(["--concurrency", "0"])
    assert "--concurrency must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        chaos_compose.main(["--only", "kill_router"])
    assert "invalid choice" in capsys.readouterr().err


def migration_fault(**extra: Any) -> dict[str, Any]:
    figures = dict.fromkeys(
        ("client_visible_errors", "hung", "lost", "duplicated", "missing", "usage_wrong"), 0
    )
    return {**clean_fault(failed_clean=0), **figures, "migrated": 3, **extra}


def test_a_migration_fault_must_migrate_unless_it_drains_within_its_grace() -> None:
    report = {
        "faults": {
            "migrate_kill": migration_fault(),
            "migrate_pause": migration_fault(migrated=0, duplicated=1),
            # a restart whose streams all finished within the grace period: none migrates
            "rolling_restart": migration_fault(
                migrated=0, drains_within_grace=True, struck_mid_stream=[True, True]
            ),
        }
    }
    assert failures(report) == [
        "migrate_pause: duplicated=1",
        "migrate_pause: migrated=0 (the fault hit no stream)",
    ]
    report["faults"]["rolling_restart"]["struck_mid_stream"] = [True, False]
    assert failures(report)[-1] == (
        "rolling_restart: struck_mid_stream=[True, False] (a restart hit no stream)"
    )
