"""Memory-manager metrics and step logs with the executor's request ids (in-process server)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from quire.block import AdmitRequest, CommitRequest, StepAllocation
from quire.block.tables import BlockTables
from services.executor.remote_allocator import RemoteBlockAllocator
from services.memory_manager import manager_servicer as servicer_module
from services.stack.ports import free_port
from tests.services.memory_manager.conftest import ManagerThread

BS = 4


class RecordingLog:
    """Stands in for the servicer's structlog logger."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))

    warning = info


@pytest.mark.parametrize("log_prompts", [False, True])
def test_step_lines_carry_request_ids_and_counters_follow(
    monkeypatch: pytest.MonkeyPatch, log_prompts: bool
) -> None:
    log = RecordingLog()
    monkeypatch.setattr(servicer_module, "log", log)
    thread = ManagerThread(metrics_port=free_port(), log_prompts=log_prompts).start()
    ids = {"a#0": "rid-a", "b#0": "rid-b"}

    def metadata(step: StepAllocation) -> tuple[tuple[str, str], ...]:
        seqs = [a.seq_id for a in step.admits] + list(step.frees)
        return (("x-request-ids", ",".join(ids[s] for s in seqs)),) if seqs else ()

    try:
        with RemoteBlockAllocator(
            thread.target,
            "e1",
            1,
            8,
            BS,
            True,
            "127.0.0.1:7000",
            BlockTables(BS),
            step_metadata=metadata,
        ) as allocator:
            allocator.register()
            allocator.step(StepAllocation(admits=(AdmitRequest("a#0", (1, 2, 3, 4, 5)),)))
            allocator.step(StepAllocation(commits=(CommitRequest("a#0", 5),)))  # not logged
            allocator.step(
                StepAllocation(frees=("a#0",), admits=(AdmitRequest("b#0", (1, 2, 3, 4, 9)),))
            )
        text = httpx.get(f"http://127.0.0.1:{thread.server.metrics_port}/metrics").text
    finally:
        thread.stop()
    steps = [fields for event, fields in log.lines if event == "step"]
    assert [s["request_ids"] for s in steps] == [["rid-a"], ["rid-b", "rid-a"]]
    assert steps[1]["num_admitted"] == 1 and steps[1]["num_freed"] == 1
    assert steps[1]["num_cached_tokens"] == 4  # b's first block was a's
    assert all(s["executor_id"] == "e1" for s in steps)
    if log_prompts:
        assert steps[0]["admitted_token_ids"] == {"a#0": [1, 2, 3, 4, 5]}
    else:
        assert all("admitted_token_ids" not in s for s in steps)
    assert 'quire_memory_manager_steps_total{executor="e1"} 3.0' in text
    assert "quire_memory_manager_step_duration_seconds_count 3.0" in text
