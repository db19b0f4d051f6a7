"""Redis layout shared by router, executors and memory managers (values are msgpack).

Redis holds only metadata that can be rebuilt: losing it degrades routing, never
correctness. Keys (``prefix`` defaults to ``quire``):

``{prefix}:executors``                 SET of executor ids that ever announced themselves
                                        (members whose record expired are dead; routers
                                        ignore them and remove them lazily).
``{prefix}:executor:{id}``              msgpack `ExecutorRecord`, TTL `LIVENESS_TTL_S`,
                                        refreshed by the executor every `HEARTBEAT_S`.
``{prefix}:prefix:{id}:{epoch}``        SET of 16-byte chained block hashes whose KV is
                                        cached on that executor incarnation. The memory
                                        manager adds a hash when a block is registered
                                        and removes it when the block is evicted, deletes
                                        the key when the executor deregisters, dies or
                                        changes epoch, and refreshes its TTL
                                        (`PREFIX_TTL_S`) while it lives.

A router finds the longest cached prefix of a prompt on every live executor in one
pipelined round trip: SMISMEMBER of the prompt's block hashes on each executor's
``prefix`` key, counting leading hits. Entries under an epoch other than the live
record's are stale and never read.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import msgpack

LIVENESS_TTL_S = 2.0  # an executor record lives this long without a heartbeat
HEARTBEAT_S = 0.5  # executors refresh their record this often
PREFIX_TTL_S = 30.0  # prefix sets vanish this long after their manager stops refreshing


def executors_key(prefix: str) -> str:
    return f"{prefix}:executors"


def executor_key(prefix: str, executor_id: str) -> str:
    return f"{prefix}:executor:{executor_id}"


def prefix_key(prefix: str, executor_id: str, epoch: int) -> str:
    return f"{prefix}:prefix:{executor_id}:{epoch}"


ROLES = ("both", "prefill", "decode")  # an executor's --role (ExecutorRecord.role)


@dataclass(frozen=True)
class ExecutorLoad:
    """An executor's load at one instant: the one record of it.

    The executor's engine loop builds it between steps; the same record goes to Redis (inside
    `ExecutorRecord`), to `GetStatus` and to the executor's gauges, and routing reads it.
    """

    num_running: int = 0  # sequences (a request with n > 1 counts n once forked)
    num_waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0  # refcount > 0
    kv_blocks_cached: int = 0  # refcount 0 but still findable by hash
    # Engine steps this incarnation has finished: a router takes an executor whose streams
    # are silent and whose count stands still for its stall bound as hung.
    num_steps: int = 0

    @property
    def kv_cache_usage(self) -> float:
        """Blocks in use / all blocks, 0..1."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    @classmethod
    def from_dict(cls, fields: Any) -> ExecutorLoad:
        if not isinstance(fields, dict):
            return cls()
        return cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class ExecutorRecord:
    """Liveness, load and self-description of one executor incarnation, as published to Redis."""

    executor_id: str
    address: str  # host:port of its gRPC Executor service
    epoch: int  # changes on every process start
    model: str  # served model name
    load: ExecutorLoad = field(default_factory=ExecutorLoad)
    # How this executor hashes KV blocks, so routers hash prompts the same way; None: not
    # announced (a record from before these fields), and routers fall back to their flags.
    block_size: int | None = None  # tokens per KV block
    hash_extra_key: str | None = None  # extra key mixed into every block hash (model id)
    draining: bool = False  # finishing its work, taking no new requests
    # Which phase of a request it takes (ROLES): "prefill" runs a new request's prompt and
    # first token and hands each output on; "decode" takes those continuations; "both" all.
    role: str = "both"
    # What a prompt token it pulled from a peer cost it as a fraction of one it computed, from
    # its own measurements (quire.engine.pull_choice); None: not measured yet, or no pulls.
    pull_cost_fraction: float | None = None
    # Its step waits for an unreachable memory manager (retrying): stalled on a dependency
    # that another executor of that manager would wait for too, so not hung.
    waiting_for_memory_manager: bool = False
    # Decoder layers its model has run this incarnation: moves inside a step that outlasts a
    # router's stall bound (a big model's prefill chunk on a CPU), where num_steps stands still.
    layers_run: int = 0
    updated_at: float = 0.0  # unix time of this heartbeat

    def serves(self, phase: str) -> bool:
        """Whether it takes work of `phase` ("prefill": new requests, "decode": continuations)."""
        return self.role in (phase, "both")

    def encode(self) -> bytes:
        return msgpack.packb(asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> ExecutorRecord:
        fields = msgpack.unpackb(data)
        if not isinstance(fields, dict):
            raise ValueError("executor record is not a map")
        known = {k: v for k, v in fields.items() if k in cls.__dataclass_fields__}
        known["load"] = ExecutorLoad.from_dict(known.get("load"))
        return cls(**known)

    def stamped(self) -> ExecutorRecord:
        return replace(self, updated_at=time.time())
