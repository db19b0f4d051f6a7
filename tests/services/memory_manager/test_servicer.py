"""The servicer through RemoteBlockAllocator and raw stubs (in-process server, no Redis)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2

from quire.block import (
    AdmitRequest,
    AppendRequest,
    BlockAllocator,
    BlockManager,
    CommitRequest,
    ForkRequest,
    StepAllocation,
    TableUpdate,
)
from quire.block.tables import BlockTables
from services.common.epochs import StaleEpochError
from services.common.wire.memory_manager import step_to_proto
from services.executor.remote_allocator import RemoteBlockAllocator
from services.rpc import memory_manager_pb2 as pb
from services.rpc import memory_manager_pb2_grpc as pb_grpc
from services.stack.ports import free_port
from tests.services.conftest import grpc_health_status
from tests.services.memory_manager.conftest import ManagerThread
from tests.services.memory_manager.prompts import BS, A, B

# Prefix hit, fork + copy-on-write, a full pool (not_admitted), preemption, frees.
SCENARIO = [
    StepAllocation(admits=(AdmitRequest("a", A),)),
    StepAllocation(
        commits=(CommitRequest("a", 10),),
        admits=(AdmitRequest("b", A[:8] + (7, 7, 7)),),
    ),
    StepAllocation(
        forks=(ForkRequest("a", "c"),),
        commits=(CommitRequest("b", 11),),
        appends=(AppendRequest("a", (1,)), AppendRequest("c", (2,))),
    ),
    StepAllocation(admits=(AdmitRequest("d", B), AdmitRequest("e", (5, 6, 7, 8)))),
    StepAllocation(
        commits=(CommitRequest("a", 11), CommitRequest("c", 11)),
        appends=(
            AppendRequest("a", (3, 4)),
            AppendRequest("b", ()),
            AppendRequest("c", ()),
            AppendRequest("d", ()),
        ),
        admits=(AdmitRequest("e", (5, 6, 7, 8)),),
    ),
    StepAllocation(frees=("b", "c"), admits=(AdmitRequest("e", A[:8] + (9,)),)),
]


def remote(target: str, executor_id: str = "e1", epoch: int = 1) -> RemoteBlockAllocator:
    return RemoteBlockAllocator(
        target,
        executor_id,
        epoch,
        8,
        BS,
        True,
        "127.0.0.1:7000",
        BlockTables(BS),
        retry_total_s=2.0,
    )


@pytest.fixture
def stub(manager: ManagerThread) -> Iterator[pb_grpc.MemoryManagerStub]:
    with grpc.insecure_channel(manager.target) as channel:
        yield pb_grpc.MemoryManagerStub(channel)


def register_request(**fields: object) -> pb.RegisterRequest:
    defaults: dict[str, object] = {
        "executor_id": "e1",
        "epoch": 1,
        "num_blocks": 8,
        "block_size": BS,
        "enable_prefix_caching": True,
        "address": "127.0.0.1:7000",
    }
    return pb.RegisterRequest(**{**defaults, **fields})  # type: ignore[arg-type]


def test_remote_allocator_matches_in_process_block_manager(manager: ManagerThread) -> None:
    local = BlockManager(num_blocks=8, block_size=BS)
    allocator: BlockAllocator = remote(manager.target)
    assert isinstance(allocator, RemoteBlockAllocator)
    assert allocator.register() == manager.target
    results = []
    for step in SCENARIO:
        expected = local.step(step)
        got = allocator.step(step)
        assert got == expected
        results.append(got)
    assert allocator.stats() == local.stats()
    # The scenario does what it says.
    assert results[1].num_cached_tokens == {"b": 8}
    assert results[2].copies == [(2, 4)]
    assert results[3].not_admitted == ["e"]
    assert results[4].preempted == ["d"]
    assert results[4].not_admitted == ["e"]
    assert results[5].table_updates == {"e": TableUpdate(0, (0, 1, 6))}
    assert results[5].num_cached_tokens == {"e": 8}
    allocator.deregister()
    allocator.close()


def test_health_and_metrics() -> None:
    thread = ManagerThread(metrics_port=free_port()).start()
    try:
        assert grpc_health_status(thread.target) == health_pb2.HealthCheckResponse.SERVING
        assert grpc_health_status(thread.target, "quire.v1.MemoryManager") == 1
        with remote(thread.target) as allocator:
            allocator.register()
            for step in SCENARIO[:3]:
                allocator.step(step)
        text = httpx.get(f"http://127.0.0.1:{thread.server.metrics_port}/metrics").text
        assert "quire_memory_manager_step_duration_seconds_count 3.0" in text
        assert 'quire_memory_manager_blocks{executor="e1"} 8.0' in text
        assert 'quire_memory_manager_blocks_used{executor="e1"}' in text
        assert 'quire_memory_manager_blocks_cached{executor="e1"}' in text
        assert "quire_memory_manager_registered_executors 1.0" in text
    finally:
        thread.stop()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_blocks": 0}, "num_blocks: must be >= 1, got 0"),
        ({"block_size": 3}, "block_size: must be a power of two, got 3"),
        ({"block_size": 0}, "block_size: must be a power of two, got 0"),
        ({"executor_id": ""}, "executor_id: must be non-empty"),
        (
            {"live_sequences": [pb.LiveSequence(seq_id="a", token_ids=[1, 2], block_table=[9])]},
            "block id 9 is not in [0, 8)",
        ),
    ],
)
def test_register_invalid_argument(
    stub: pb_grpc.MemoryManagerStub, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Register(register_request(**fields))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()


def test_unknown_executor_is_not_found(stub: pb_grpc.MemoryManagerStub) -> None:
    for call in (
        lambda: stub.Step(pb.StepRequest(executor_id="nobody", epoch=1)),
        lambda: stub.GetStats(pb.GetStatsRequest(executor_id="nobody")),
    ):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert "executor not registered" in info.value.details()
    stub.Deregister(pb.DeregisterRequest(executor_id="nobody", epoch=1))  # a no-op


def test_stale_epoch_is_failed_precondition(
    manager: ManagerThread, stub: pb_grpc.MemoryManagerStub
) -> None:
    stub.Register(register_request(epoch=5))
    for call in (
        lambda: stub.Step(pb.StepRequest(executor_id="e1", epoch=4)),
        lambda: stub.Register(register_request(epoch=4)),
        lambda: stub.Deregister(pb.DeregisterRequest(executor_id="e1", epoch=4)),
    ):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "epoch 4" in info.value.details()
    # Through the client: a typed error, no re-registration attempt.
    with remote(manager.target, epoch=4) as allocator, pytest.raises(StaleEpochError):
        allocator.step(SCENARIO[0])
    stub.Step(step_to_proto("e1", 5, SCENARIO[0]))  # the registered epoch still works


def test_malformed_step_changes_nothing(manager: ManagerThread) -> None:
    local = BlockManager(num_blocks=8, block_size=BS)
    with remote(manager.target) as allocator:
        allocator.register()
        for step in SCENARIO[:3]:
            assert allocator.step(step) == local.step(step)
        before = allocator.stats()
        bad = [
            StepAllocation(frees=("zzz",)),
            StepAllocation(admits=(AdmitRequest("x", B),), appends=(AppendRequest("zzz", (1,)),)),
            StepAllocation(admits=(AdmitRequest("x", B), AdmitRequest("x", B))),
            StepAllocation(commits=(CommitRequest("a", 99),)),
        ]
        for step in bad:
            with pytest.raises(ValueError, match="zzz|listed twice|99"):
                allocator.step(step)
        assert allocator.stats() == before
        # The next valid step behaves as if the bad ones never came.
        for step in SCENARIO[3:]:
            assert allocator.step(step) == local.step(step)
        assert allocator.stats() == local.stats()


def test_new_epoch_replaces_state(stub: pb_grpc.MemoryManagerStub) -> None:
    stub.Register(register_request(epoch=1))
    stub.Step(step_to_proto("e1", 1, SCENARIO[0]))
    assert stub.GetStats(pb.GetStatsRequest(executor_id="e1")).num_blocks_used == 3
    live = pb.LiveSequence(seq_id="z", token_ids=[1, 2, 3, 4, 5], block_table=[6, 7])
    stub.Register(register_request(epoch=2, num_blocks=16, live_sequences=[live]))
    stats = stub.GetStats(pb.GetStatsRequest(executor_id="e1"))
    assert (stats.num_blocks_total, stats.num_blocks_used) == (16, 2)
    response = stub.Step(
        step_to_proto("e1", 2, StepAllocation(appends=(AppendRequest("z", (6, 7, 8, 9)),)))
    )
    # z's third block is new; its first two stay.
    update = response.table_updates["z"]
    assert (update.start, list(update.block_ids)) == (2, [0])


def _step(stub: pb_grpc.MemoryManagerStub, executor_id: str, step: StepAllocation):  # type: ignore[no-untyped-def]
    return stub.Step(step_to_proto(executor_id, 1, step))


def _states(stub: pb_grpc.MemoryManagerStub, executor_id: str) -> bytes:
    return stub.GetBlockStates(pb.GetBlockStatesRequest(executor_id=executor_id)).states


def _offer_e2s_blocks_to_e1(stub: pb_grpc.MemoryManagerStub) -> tuple[pb.StepResponse, list[int]]:
    """e2 computes A (2 full blocks + 2) and finishes, then e1 admits A: the step's response
    and the blocks e2 held cached."""
    for executor_id, port in (("e1", 7001), ("e2", 7002)):
        stub.Register(
            register_request(
                executor_id=executor_id, address=f"127.0.0.1:{port}", accepts_pulls=True
            )
        )
    _step(stub, "e2", StepAllocation(admits=(AdmitRequest("a", A),)))
    _step(stub, "e2", StepAllocation(commits=(CommitRequest("a", len(A)),), frees=("a",)))
    cached = [i for i, s in enumerate(_states(stub, "e2")) if s == 2]
    assert len(cached) == 2
    return _step(stub, "e1", StepAllocation(admits=(AdmitRequest("x", A),))), cached


def test_a_peers_blocks_are_offered_pinned_and_released(stub: pb_grpc.MemoryManagerStub) -> None:
    def step(executor_id: str, step: StepAllocation) -> pb.StepResponse:
        return _step(stub, executor_id, step)

    def states(executor_id: str) -> bytes:
        return _states(stub, executor_id)

    offered, cached = _offer_e2s_blocks_to_e1(stub)
    assert offered.num_cached_tokens == {"x": 0}
    offer = offered.pulls["x"]
    assert (offer.source_executor_id, offer.source_address) == ("e2", "127.0.0.1:7002")
    assert (offer.first_block, sorted(offer.source_block_ids)) == (0, cached)
    assert offer.granted_by  # this manager instance
    assert [states("e2")[b] for b in offer.source_block_ids] == [1, 1]  # pinned: in use
    # Released in e1's next step: cached again on e2.
    step("e1", StepAllocation(released_pins=(offer.pin_id,)))
    assert [states("e2")[b] for b in offer.source_block_ids] == [2, 2]


def test_a_pin_nobody_releases_expires_while_no_executor_steps() -> None:
    manager = ManagerThread(pull_lease_s=0.5).start()
    try:
        with grpc.insecure_channel(manager.target) as channel:
            stub = pb_grpc.MemoryManagerStub(channel)
            offered, _ = _offer_e2s_blocks_to_e1(stub)
            pinned = offered.pulls["x"].source_block_ids
            assert [_states(stub, "e2")[b] for b in pinned] == [1, 1]
            # No executor steps again (both idle, e1 never releases): the lease still ends.
            deadline = time.monotonic() + 10.0
            while [_states(stub, "e2")[b] for b in pinned] != [2, 2]:
                assert time.monotonic() < deadline, "the pin outlived its lease"
                time.sleep(0.1)
    finally:
        manager.stop()
