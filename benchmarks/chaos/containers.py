"""The compose stack's containers through docker: find one, run a command, read the pools.

The memory manager's gRPC port is not published, so its pools are read by a probe run inside
its own container.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from benchmarks.chaos.stack import REPO

PROJECT = "quire"  # the docker-compose project of `make compose-up`
NETWORK = f"{PROJECT}_default"
EXECUTORS = ["executor-0", "executor-1"]

# GetBlockStates for each executor, run inside the memory manager's container (its port is
# not published): the manager's own view of every pool.
POOLS_PROBE = """
import json, sys, grpc
from services.rpc import memory_manager_pb2 as pb, memory_manager_pb2_grpc as rpc
pools = {}
with grpc.insecure_channel("127.0.0.1:50051") as channel:
    stub = rpc.MemoryManagerStub(channel)
    for eid in sys.argv[1:]:
        s = stub.GetBlockStates(pb.GetBlockStatesRequest(executor_id=eid), timeout=5)
        counts = [0, 0, 0, 0]
        for b in s.states:
            counts[b] += 1
        pools[eid] = {"total": s.stats.num_blocks_total, "used": s.stats.num_blocks_used,
                      "cached": s.stats.num_blocks_cached,
                      "consistent": len(s.states) == s.stats.num_blocks_total
                      and counts[1] + counts[3] == s.stats.num_blocks_used
                      and counts[2] == s.stats.num_blocks_cached}
print(json.dumps(pools))
"""


def run(*command: str, timeout: float = 120) -> str:
    """Run a command from the repository root; its stdout, or RuntimeError with its stderr."""
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()[-400:]}")
    return done.stdout.strip()


def container(service: str) -> str:
    """The container id of a compose service."""
    cid = run("deploy/docker/compose.sh", "compose", "ps", "-q", service)
    if not cid:
        raise RuntimeError(f"compose service {service} has no container: run `make compose-up`")
    return cid


def manager_pools() -> dict[str, Any]:
    """Each executor's pool as the memory manager holds it, with a consistency verdict."""
    out = run(
        "docker", "exec", container("memory-manager"), "python", "-c", POOLS_PROBE, *EXECUTORS
    )
    pools: dict[str, Any] = json.loads(out)
    return pools
