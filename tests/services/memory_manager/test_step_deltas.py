"""Step deltas over gRPC: random steps against the in-process allocator, and drift repair."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from quire.block import (
    AdmitRequest,
    AppendRequest,
    BlockManager,
    CommitRequest,
    ForkRequest,
    StepAllocation,
    StepAllocationResult,
    TableDriftError,
)
from services.executor import remote_allocator
from tests.services.memory_manager.conftest import ManagerThread, MirroredAllocator

BS = 4
NUM_BLOCKS = 24
PREFIXES = [tuple(range(100, 108)), tuple(range(200, 212))]


def random_step(
    rng: random.Random, oracle: BlockManager, waiting: list[str], n: int
) -> StepAllocation:
    """A valid random step: frees, forks, commits, appends of every live sequence, admits."""
    live = oracle.seq_ids()
    frees = [s for s in live if rng.random() < 0.1]
    kept = [s for s in live if s not in frees]
    forks = [ForkRequest(p, f"{p}.f{n}") for p in kept if rng.random() < 0.05]
    commits = [
        CommitRequest(s, rng.randint(0, oracle.num_tokens(s))) for s in kept if rng.random() < 0.5
    ]
    running = kept + [f.child_seq_id for f in forks]
    appends = [
        AppendRequest(s, tuple(rng.randrange(50) for _ in range(rng.choice([0, 1, 1, 1, 3]))))
        for s in running
    ]
    admits = []
    for seq_id in [*waiting[:1], *(f"s{n}.{i}" for i in range(rng.randint(0, 2)))]:
        prompt = rng.choice(PREFIXES)[: rng.randint(1, 12)] + tuple(
            rng.randrange(50) for _ in range(rng.randint(1, 9))
        )
        admits.append(AdmitRequest(seq_id, prompt))
    return StepAllocation(
        forks=tuple(forks),
        commits=tuple(commits),
        frees=tuple(frees),
        appends=tuple(appends),
        admits=tuple(admits),
        verify_tables=True,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_deltas_over_grpc_give_the_oracles_tables(manager: ManagerThread, seed: int) -> None:
    rng = random.Random(seed)
    oracle = BlockManager(NUM_BLOCKS, BS)
    executor = MirroredAllocator(
        manager.target, num_blocks=NUM_BLOCKS, block_size=BS, verify_every=1
    )
    executor.allocator.register()
    waiting: list[str] = []
    seen = {"preempted": 0, "copies": 0, "updates": 0}
    for n in range(120):
        request = random_step(rng, oracle, waiting, n)
        expected = oracle.step(request)
        got = executor.step(
            **{f: getattr(request, f) for f in ("forks", "commits", "frees", "appends", "admits")}
        )
        # A quiet step makes no call, so it carries no checksums; the sent ones' are checked
        # by the tables (num_resyncs below).
        assert replace(got, table_checksums={}) == replace(expected, table_checksums={}), (
            f"step {n}"
        )
        live = {s: oracle.block_table(s) for s in oracle.seq_ids()}
        assert executor.tables(*live) == live
        assert len(executor.block_tables) == len(live)
        waiting = [*expected.preempted, *[s for s in expected.not_admitted if s in waiting]]
        seen["preempted"] += len(expected.preempted)
        seen["copies"] += len(expected.copies)
        seen["updates"] += len(expected.table_updates)
    assert executor.allocator.num_resyncs == 0
    assert all(seen.values()), seen  # the run exercised preemption, copy-on-write and updates
    executor.allocator.close()


def _drop_first_update(monkeypatch: pytest.MonkeyPatch, times: int) -> list[str]:
    """Make the client lose one table update per Step response, `times` times."""
    dropped: list[str] = []
    decode = remote_allocator.result_from_proto

    def lossy(response: object) -> StepAllocationResult:
        result = decode(response)  # type: ignore[arg-type]
        if result.table_updates and len(dropped) < times:
            seq_id = next(iter(result.table_updates))
            dropped.append(seq_id)
            updates = {k: v for k, v in result.table_updates.items() if k != seq_id}
            return replace(result, table_updates=updates)
        return result

    monkeypatch.setattr(remote_allocator, "result_from_proto", lossy)
    return dropped


def test_a_dropped_update_is_caught_and_resynced(
    manager: ManagerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = MirroredAllocator(manager.target, num_blocks=16, block_size=BS, verify_every=1)
    executor.allocator.register()
    executor.step(admits=(AdmitRequest("a", (1, 2, 3, 4, 5)), AdmitRequest("b", (6, 7, 8))))
    dropped = _drop_first_update(monkeypatch, times=1)
    # a crosses into its third block: the update is lost on the way, the checksum catches it.
    result = executor.step(appends=(AppendRequest("a", (9, 9, 9, 9)), AppendRequest("b", ())))
    assert dropped == ["a"]
    assert executor.allocator.num_resyncs == 1
    assert executor.allocator.num_registrations == 2
    # The retried step (after the manager was rebuilt from the executor's tables) applied.
    assert result.table_updates["a"].start == 2
    table = executor.tables("a")["a"]
    assert len(table) == 3
    # Executor and manager agree from here on: verified steps raise nothing.
    executor.step(appends=(AppendRequest("a", (1, 1, 1, 1)), AppendRequest("b", (2,))))
    assert executor.allocator.num_resyncs == 1
    stats = executor.allocator.stats()
    assert stats.num_blocks_used == 5  # a: 4 blocks, b: 1; nothing leaked by the resync


def test_a_lost_new_block_is_caught_by_length_without_checksums(
    manager: ManagerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = MirroredAllocator(manager.target, num_blocks=16, block_size=BS, verify_every=0)
    executor.allocator.register()
    executor.step(admits=(AdmitRequest("a", (1, 2, 3, 4)),))
    _drop_first_update(monkeypatch, times=1)
    # a's fifth token needs a second block; its update is lost, the length check sees it.
    result = executor.step(appends=(AppendRequest("a", (5,)),))
    assert executor.allocator.num_resyncs == 1
    assert result.table_updates["a"].start == 1
    assert len(executor.tables("a")["a"]) == 2


def test_drift_that_persists_raises(
    manager: ManagerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = MirroredAllocator(manager.target, num_blocks=16, block_size=BS, verify_every=1)
    executor.allocator.register()
    _drop_first_update(monkeypatch, times=2)
    with pytest.raises(TableDriftError, match="again after a resync"):
        executor.step(admits=(AdmitRequest("a", (1, 2, 3)),))
