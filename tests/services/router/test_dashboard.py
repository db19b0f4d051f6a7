"""GET /dashboard and /dashboard/state against a real in-process memory manager."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from quire.block import AdmitRequest, StepAllocation
from services.common.wire.memory_manager import step_to_proto
from services.rpc import memory_manager_pb2 as pb
from services.rpc import memory_manager_pb2_grpc as pb_grpc
from services.stack.ports import free_port
from tests.services.memory_manager.conftest import ManagerThread
from tests.services.router.conftest import Cluster


@pytest.fixture
def manager() -> Iterator[ManagerThread]:
    """A memory manager holding ex-a's pool: 8 blocks of 4 tokens, 3 of them in use."""
    thread = ManagerThread().start()
    with grpc.insecure_channel(thread.target) as channel:
        stub = pb_grpc.MemoryManagerStub(channel)
        register = pb.RegisterRequest(
            executor_id="ex-a", epoch=7, num_blocks=8, block_size=4, enable_prefix_caching=True
        )
        stub.Register(register)
        admit = StepAllocation(admits=(AdmitRequest("s", tuple(range(10))),))
        stub.Step(step_to_proto("ex-a", 7, admit))
    yield thread
    thread.stop()


def test_state_has_the_pools_block_states(cluster: Cluster, manager: ManagerThread) -> None:
    cluster.publish("ex-a", num_running=1, num_waiting=2)
    router = cluster.router(memory_manager=manager.target)
    with router.admin() as admin:
        state = admin.get("/dashboard/state").json()
        page = admin.get("/dashboard")
    assert state["error"] is None and state["memory_manager"] == manager.target
    by_id = {e["id"]: e for e in state["executors"]}
    assert list(by_id) == ["ex-a", "ex-b", "ex-c"]
    a = by_id["ex-a"]
    assert a["states"] == "11100000"
    assert (a["num_blocks_total"], a["num_blocks_used"], a["block_size"]) == (8, 3, 4)
    assert (a["num_running"], a["num_waiting"], a["healthy"]) == (1, 2, True)
    assert a["prefix_hit_rate"] == 0.0 and a["error"] is None
    # Executors registered with another manager are listed, without a pool.
    assert "executor not registered" in by_id["ex-b"]["error"] and by_id["ex-b"]["states"] == ""
    assert page.status_code == 200 and "dashboard/state" in page.text


@pytest.mark.parametrize("address", ["", "unreachable"])
def test_state_says_when_the_manager_cannot_be_asked(cluster: Cluster, address: str) -> None:
    target = f"127.0.0.1:{free_port()}" if address else ""
    router = cluster.router(memory_manager=target)
    with router.admin() as admin:
        state = admin.get("/dashboard/state").json()
    assert [e["id"] for e in state["executors"]] == ["ex-a", "ex-b", "ex-c"]
    assert all(e["states"] == "" for e in state["executors"])
    assert ("UNAVAILABLE" if address else "no memory manager configured") in state["error"]
