"""GetBlockStates over gRPC: the pool's state bytes and counters, NOT_FOUND for strangers."""

from __future__ import annotations

import grpc
import pytest

from quire.block import BlockManager, StepAllocation
from services.common.wire.memory_manager import stats_from_proto, step_to_proto
from services.rpc import memory_manager_pb2 as pb
from services.rpc import memory_manager_pb2_grpc as pb_grpc
from tests.services.memory_manager.conftest import ManagerThread
from tests.services.memory_manager.test_servicer import BS, SCENARIO, register_request


def test_block_states_match_the_in_process_manager(manager: ManagerThread) -> None:
    local = BlockManager(num_blocks=8, block_size=BS)
    with grpc.insecure_channel(manager.target) as channel:
        stub = pb_grpc.MemoryManagerStub(channel)
        stub.Register(register_request(epoch=3))
        request = pb.GetBlockStatesRequest(executor_id="e1")
        assert stub.GetBlockStates(request).states == bytes(8)
        seen: set[int] = set()
        # The scenario, then freeing what it leaves running: every state comes up.
        for step in [*SCENARIO, StepAllocation(frees=("a", "e"))]:
            local.step(step)
            stub.Step(step_to_proto("e1", 3, step))
            got = stub.GetBlockStates(request)
            assert got.states == local.block_states()
            assert stats_from_proto(got.stats) == local.stats()
            assert (got.epoch, got.block_size) == (3, BS)
            seen.update(got.states)
        assert seen == {0, 1, 2, 3}

        with pytest.raises(grpc.RpcError) as info:
            stub.GetBlockStates(pb.GetBlockStatesRequest(executor_id="nobody"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
