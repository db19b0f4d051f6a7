"""Malformed Register / Step messages are refused without touching any pool's state."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import grpc
import pytest

from quire.block import AdmitRequest, AppendRequest, BlockManager, CommitRequest, StepAllocation
from services.common.wire.memory_manager import result_to_proto, step_to_proto
from services.memory_manager.manager_servicer import MAX_BLOCK_SIZE, MAX_NUM_BLOCKS, MAX_SEQ_TOKENS
from services.rpc import memory_manager_pb2 as pb
from services.rpc import memory_manager_pb2_grpc as pb_grpc
from tests.services.memory_manager.conftest import ManagerThread

BS = 4
EPOCH = 3
FIRST = StepAllocation(admits=(AdmitRequest("a", tuple(range(1, 11))),))  # 3 blocks
SECOND = StepAllocation(
    commits=(CommitRequest("a", 10),),
    appends=(AppendRequest("a", (11, 12)),),
    admits=(AdmitRequest("b", (1, 2, 3, 4, 9)),),
)


@pytest.fixture(scope="module")
def module_manager() -> Iterator[ManagerThread]:
    thread = ManagerThread().start()
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def stub(module_manager: ManagerThread) -> Iterator[pb_grpc.MemoryManagerStub]:
    with grpc.insecure_channel(module_manager.target) as channel:
        yield pb_grpc.MemoryManagerStub(channel)


def register(stub: pb_grpc.MemoryManagerStub, executor_id: str, **fields: object) -> None:
    values: dict[str, object] = {
        "executor_id": executor_id,
        "epoch": EPOCH,
        "num_blocks": 8,
        "block_size": BS,
        "enable_prefix_caching": True,
        "address": "127.0.0.1:7000",
    }
    stub.Register(pb.RegisterRequest(**{**values, **fields}))  # type: ignore[arg-type]


def snapshot(stub: pb_grpc.MemoryManagerStub, executor_id: str) -> pb.BlockStates:
    return stub.GetBlockStates(pb.GetBlockStatesRequest(executor_id=executor_id))


def expect(code: grpc.StatusCode, call: object, fragment: str = "") -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    assert info.value.code() == code, info.value.details()
    assert fragment in (info.value.details() or "")


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"num_blocks": 0}, "num_blocks: must be >= 1"),
        ({"num_blocks": MAX_NUM_BLOCKS + 1}, f"num_blocks: must be <= {MAX_NUM_BLOCKS}"),
        ({"num_blocks": 2**32 - 1}, "num_blocks"),  # a "negative" count sent as uint32
        ({"block_size": MAX_BLOCK_SIZE * 2}, "block_size"),
        ({"block_size": 2**31}, "block_size"),
        (
            {"live_sequences": [pb.LiveSequence(seq_id="z", token_ids=[1] * (MAX_SEQ_TOKENS + 1))]},
            "token ids",
        ),
        (
            {
                "live_sequences": [
                    pb.LiveSequence(seq_id="z", token_ids=[1, 2], block_table=[0]),
                    pb.LiveSequence(seq_id="z", token_ids=[1, 2], block_table=[1]),
                ]
            },
            "listed twice",
        ),
    ],
)
def test_bad_register_keeps_the_old_pool(
    stub: pb_grpc.MemoryManagerStub, fields: dict[str, object], fragment: str
) -> None:
    executor_id = f"reg-{uuid.uuid4().hex[:8]}"
    register(stub, executor_id)
    stub.Step(step_to_proto(executor_id, EPOCH, FIRST))
    before = snapshot(stub, executor_id)
    expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: register(stub, executor_id, epoch=EPOCH + 1, **fields),
        fragment,
    )
    assert snapshot(stub, executor_id) == before
    stub.Step(step_to_proto(executor_id, EPOCH, SECOND))  # the old epoch still serves


def test_bad_steps_change_nothing(stub: pb_grpc.MemoryManagerStub) -> None:
    register(stub, "steps")
    local = BlockManager(num_blocks=8, block_size=BS)
    assert stub.Step(step_to_proto("steps", EPOCH, FIRST)) == result_to_proto(local.step(FIRST))
    before = snapshot(stub, "steps")
    stats_before = stub.GetStats(pb.GetStatsRequest(executor_id="steps"))
    invalid = [
        (pb.StepRequest(frees=["nobody"]), "unknown seq_id"),
        (pb.StepRequest(frees=["a", "a"]), "listed twice"),
        (pb.StepRequest(commits=[pb.Commit(seq_id="nobody", num_computed_tokens=1)]), "unknown"),
        (pb.StepRequest(commits=[pb.Commit(seq_id="a", num_computed_tokens=2**32 - 1)]), "a"),
        (pb.StepRequest(appends=[pb.Append(seq_id="nobody", token_ids=[1])]), "unknown"),
        (
            pb.StepRequest(appends=[pb.Append(seq_id="a", token_ids=[1] * (MAX_SEQ_TOKENS + 1))]),
            "token ids",
        ),
        (pb.StepRequest(forks=[pb.Fork(parent_seq_id="nobody", child_seq_id="c")]), "unknown"),
        (pb.StepRequest(forks=[pb.Fork(parent_seq_id="a", child_seq_id="a")]), "already"),
        (pb.StepRequest(admits=[pb.Admit(seq_id="a", token_ids=[1])]), "already live"),
        (
            pb.StepRequest(
                admits=[pb.Admit(seq_id="x", token_ids=[1]), pb.Admit(seq_id="x", token_ids=[2])]
            ),
            "listed twice",
        ),
        (
            pb.StepRequest(admits=[pb.Admit(seq_id="x", token_ids=[1] * (MAX_SEQ_TOKENS + 1))]),
            "token ids",
        ),
        # A valid admit next to a bad free: the admit must not happen either.
        (
            pb.StepRequest(admits=[pb.Admit(seq_id="y", token_ids=[5, 6])], frees=["nobody"]),
            "nobody",
        ),
    ]
    for message, fragment in invalid:
        message.executor_id, message.epoch = "steps", EPOCH
        expect(grpc.StatusCode.INVALID_ARGUMENT, lambda m=message: stub.Step(m), fragment)
    expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: stub.Step(step_to_proto("steps", EPOCH - 1, SECOND)),
        "epoch",
    )
    expect(
        grpc.StatusCode.NOT_FOUND,
        lambda: stub.Step(step_to_proto("nobody", EPOCH, SECOND)),
        "not registered",
    )
    assert snapshot(stub, "steps") == before
    assert stub.GetStats(pb.GetStatsRequest(executor_id="steps")) == stats_before
    # The next valid step behaves as if the bad ones never came.
    assert stub.Step(step_to_proto("steps", EPOCH, SECOND)) == result_to_proto(local.step(SECOND))


def test_token_ids_past_uint32_cannot_be_sent() -> None:
    """uint32 on the wire: an out-of-range id never reaches the manager."""
    with pytest.raises(ValueError):
        pb.Admit(seq_id="x", token_ids=[2**32])
    with pytest.raises(ValueError):
        pb.Admit(seq_id="x", token_ids=[-1])
