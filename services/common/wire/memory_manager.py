"""Field-for-field translation between quire.block's allocator dataclasses and quire.v1 protos.

Both ends use it: the memory manager's servicer (proto -> StepAllocation, result ->
proto) and `RemoteBlockAllocator` (the reverse), so the two stay exact mirrors.
"""

from __future__ import annotations

import dataclasses

from quire.block.allocator import (
    AdmitRequest,
    AllocatorStats,
    AppendRequest,
    CommitRequest,
    ForkRequest,
    PullOffer,
    StepAllocation,
    StepAllocationResult,
    TableUpdate,
)
from quire.block.restore import LiveSequenceState
from services.rpc import memory_manager_pb2 as pb


def step_to_proto(executor_id: str, epoch: int, step: StepAllocation) -> pb.StepRequest:
    """The Step request carrying one engine step's allocation."""
    return pb.StepRequest(
        executor_id=executor_id,
        epoch=epoch,
        forks=[
            pb.Fork(parent_seq_id=f.parent_seq_id, child_seq_id=f.child_seq_id) for f in step.forks
        ],
        commits=[
            pb.Commit(seq_id=c.seq_id, num_computed_tokens=c.num_computed_tokens)
            for c in step.commits
        ],
        frees=list(step.frees),
        appends=[pb.Append(seq_id=a.seq_id, token_ids=a.token_ids) for a in step.appends],
        admits=[
            pb.Admit(
                seq_id=a.seq_id,
                token_ids=a.token_ids,
                extra_key=a.extra_key,
                skip_prefix_cache=a.skip_prefix_cache,
            )
            for a in step.admits
        ],
        verify_tables=step.verify_tables,
        released_pins=list(step.released_pins),
        deferred_appends=[
            pb.Append(seq_id=a.seq_id, token_ids=a.token_ids) for a in step.deferred_appends
        ],
    )


def step_from_proto(request: pb.StepRequest) -> StepAllocation:
    """The StepAllocation a Step request describes."""
    return StepAllocation(
        forks=tuple(ForkRequest(f.parent_seq_id, f.child_seq_id) for f in request.forks),
        commits=tuple(CommitRequest(c.seq_id, c.num_computed_tokens) for c in request.commits),
        frees=tuple(request.frees),
        appends=tuple(AppendRequest(a.seq_id, tuple(a.token_ids)) for a in request.appends),
        admits=tuple(
            AdmitRequest(a.seq_id, tuple(a.token_ids), a.extra_key, a.skip_prefix_cache)
            for a in request.admits
        ),
        verify_tables=request.verify_tables,
        released_pins=tuple(request.released_pins),
        deferred_appends=tuple(
            AppendRequest(a.seq_id, tuple(a.token_ids)) for a in request.deferred_appends
        ),
    )


def result_to_proto(result: StepAllocationResult) -> pb.StepResponse:
    """The Step response for an allocator result."""
    return pb.StepResponse(
        num_cached_tokens=result.num_cached_tokens,
        copies=[pb.BlockCopy(src=src, dst=dst) for src, dst in result.copies],
        preempted=result.preempted,
        not_admitted=result.not_admitted,
        table_updates={
            seq_id: pb.TableUpdate(start=update.start, block_ids=update.block_ids)
            for seq_id, update in result.table_updates.items()
        },
        table_checksums=result.table_checksums,
        pulls={
            seq_id: pb.PullOffer(**dataclasses.asdict(offer))
            for seq_id, offer in result.pulls.items()
        },
    )


def result_from_proto(response: pb.StepResponse) -> StepAllocationResult:
    """The allocator result a Step response carries."""
    updates = {
        seq_id: TableUpdate(update.start, tuple(update.block_ids))
        for seq_id, update in response.table_updates.items()
    }
    return StepAllocationResult(
        num_cached_tokens=dict(response.num_cached_tokens),
        copies=[(copy.src, copy.dst) for copy in response.copies],
        preempted=list(response.preempted),
        not_admitted=list(response.not_admitted),
        table_updates=updates,
        table_checksums=dict(response.table_checksums),
        pulls={seq_id: _offer_from_proto(offer) for seq_id, offer in response.pulls.items()},
    )


def _offer_from_proto(message: pb.PullOffer) -> PullOffer:
    return PullOffer(
        pin_id=message.pin_id,
        source_executor_id=message.source_executor_id,
        source_address=message.source_address,
        granted_by=message.granted_by,
        first_block=message.first_block,
        source_block_ids=tuple(message.source_block_ids),
    )


def live_to_proto(state: LiveSequenceState) -> pb.LiveSequence:
    """One live sequence for a Register request."""
    return pb.LiveSequence(
        seq_id=state.seq_id,
        token_ids=state.token_ids,
        block_table=state.block_table,
        num_computed_tokens=state.num_computed_tokens,
        extra_key=state.extra_key,
    )


def live_from_proto(message: pb.LiveSequence) -> LiveSequenceState:
    """The live sequence a Register request describes."""
    return LiveSequenceState(
        seq_id=message.seq_id,
        token_ids=tuple(message.token_ids),
        block_table=tuple(message.block_table),
        num_computed_tokens=message.num_computed_tokens,
        extra_key=message.extra_key,
    )


def stats_to_proto(stats: AllocatorStats) -> pb.PoolStats:
    """PoolStats for a GetStats response (the proto's fields are AllocatorStats' names)."""
    return pb.PoolStats(**dataclasses.asdict(stats))


def stats_from_proto(message: pb.PoolStats) -> AllocatorStats:
    """AllocatorStats from a GetStats response."""
    return AllocatorStats(
        **{f.name: getattr(message, f.name) for f in dataclasses.fields(AllocatorStats)}
    )
