"""What the BlockManager tests share: the block size, two prompts, request builders and a
step checked against whole tables and the manager's own integrity check."""

from __future__ import annotations

from collections.abc import Sequence

from quire.block import (
    AdmitRequest,
    AppendRequest,
    BlockManager,
    CommitRequest,
    StepAllocation,
    StepAllocationResult,
)
from tests.libs.block.mirror import checked_step

BS = 4
A = list(range(100, 110))  # 10 tokens: 2 full blocks + 2
B = list(range(200, 210))  # 10 tokens: 2 full blocks + 2


def admit(seq_id: str, tokens: Sequence[int], extra_key: str = "") -> AdmitRequest:
    return AdmitRequest(seq_id, tuple(tokens), extra_key)


def append(seq_id: str, tokens: Sequence[int] = ()) -> AppendRequest:
    return AppendRequest(seq_id, tuple(tokens))


def commit(seq_id: str, num_computed_tokens: int) -> CommitRequest:
    return CommitRequest(seq_id, num_computed_tokens)


def run(manager: BlockManager, **fields: object) -> StepAllocationResult:
    """One step of `fields`, checked against the caller's tables, then the manager's
    integrity check."""
    result = checked_step(manager, StepAllocation(**fields))  # type: ignore[arg-type]
    manager.check_integrity()
    return result


def refcounts(manager: BlockManager) -> list[int]:
    return [manager.pool.refcount(b) for b in range(manager.num_blocks)]
