"""RemoteBlockAllocator pieces that need no server: step filtering, giving up on time."""

from __future__ import annotations

import time

import pytest

from quire.block import AdmitRequest, AppendRequest, CommitRequest, ForkRequest, StepAllocation
from quire.block.tables import BlockTables
from services.executor.remote_allocator import (
    AllocatorUnavailableError,
    RemoteBlockAllocator,
    filter_step,
)
from services.stack.ports import free_port


def test_filter_drops_commits_and_frees_of_unknown_sequences() -> None:
    step = StepAllocation(
        forks=(ForkRequest("a", "a1"),),
        commits=(CommitRequest("a", 4), CommitRequest("gone", 8), CommitRequest("a1", 4)),
        frees=("gone", "a1", "done"),
        appends=(AppendRequest("a", (1,)), AppendRequest("b", ())),
        admits=(AdmitRequest("new", (1, 2)),),
    )
    filtered = filter_step(step, {"a", "b"})
    assert filtered == StepAllocation(
        forks=step.forks,
        commits=(CommitRequest("a", 4), CommitRequest("a1", 4)),
        frees=("a1",),
        appends=step.appends,
        admits=step.admits,
    )
    assert filter_step(step, {"a", "b", "gone", "done"}) == step


def test_filter_refuses_forks_and_appends_of_unknown_sequences() -> None:
    with pytest.raises(ValueError, match="forks: parent_seq_id 'x'"):
        filter_step(StepAllocation(forks=(ForkRequest("x", "y"),)), {"a"})
    with pytest.raises(ValueError, match="appends: seq_id 'x'"):
        filter_step(StepAllocation(appends=(AppendRequest("x", (1,)),)), {"a"})


def test_unreachable_manager_raises_after_retry_budget() -> None:
    allocator = RemoteBlockAllocator(
        f"127.0.0.1:{free_port()}", "e1", 1, 8, 4, True, "", BlockTables(4), retry_total_s=0.5
    )
    start = time.monotonic()
    with pytest.raises(AllocatorUnavailableError):
        allocator.register()
    with pytest.raises(AllocatorUnavailableError, match="unreachable"):
        allocator.step(StepAllocation())
    with pytest.raises(AllocatorUnavailableError):
        allocator.stats()
    assert time.monotonic() - start < 5
    allocator.close()
