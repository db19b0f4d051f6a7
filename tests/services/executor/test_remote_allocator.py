"""RemoteBlockAllocator pieces that need no server: step filtering, giving up on time."""

from __future__ import annotations

import threading
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
        allocator.step(StepAllocation(admits=(AdmitRequest("a", (1, 2)),)))
    with pytest.raises(AllocatorUnavailableError):
        allocator.stats()
    assert time.monotonic() - start < 5
    allocator.close()


def test_a_step_waiting_for_the_manager_says_so_until_it_gives_up() -> None:
    allocator = RemoteBlockAllocator(
        f"127.0.0.1:{free_port()}", "e1", 1, 8, 4, True, "", BlockTables(4), retry_total_s=1.0
    )
    seen: list[bool] = []

    def step() -> None:
        with pytest.raises(AllocatorUnavailableError):
            allocator.step(StepAllocation(admits=(AdmitRequest("a", (1, 2)),)))

    thread = threading.Thread(target=step)
    assert not allocator.is_recovering
    thread.start()
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        if allocator.is_recovering:
            seen.append(True)
        time.sleep(0.01)
    thread.join(10)
    assert seen == [True], "the retrying step never said it waits for the manager"
    assert not allocator.is_recovering
    allocator.close()
