"""The quire.v1.MemoryManager servicer: translate protos, delegate to `ExecutorPools`.

Status codes: INVALID_ARGUMENT for a malformed request (nothing changed), NOT_FOUND
for an executor that is not registered here ("executor not registered"; executors
re-register on it), FAILED_PRECONDITION for a stale epoch. Every handler runs on
the event loop without awaiting between reading and changing state, so calls
never interleave. Prefix-index changes go to the `PrefixPublisher`, which writes
them to Redis in the background: Redis never delays or fails a Step.
"""

from __future__ import annotations

import time
import uuid
from typing import NoReturn

import grpc
import structlog

from services.common.epochs import StaleEpochError
from services.common.wire.memory_manager import (
    live_from_proto,
    result_to_proto,
    stats_to_proto,
    step_from_proto,
)
from services.memory_manager.manager_metrics import ManagerMetrics
from services.memory_manager.pools import ExecutorPool, ExecutorPools, UnknownExecutorError
from services.memory_manager.prefix_publisher import PrefixPublisher
from services.memory_manager.pull_broker import PullBroker
from services.rpc import memory_manager_pb2 as pb
from services.rpc import memory_manager_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

MAX_LOGGED_REQUEST_IDS = 64  # of a Step's x-request-ids metadata

# Sanity caps on what one message may ask for. num_blocks sizes the pool's tables at
# Register, so an absurd one would be a memory bomb; a sequence longer than MAX_SEQ_TOKENS
# is far past any model's context.
MAX_NUM_BLOCKS = 2**24
MAX_BLOCK_SIZE = 2**12
MAX_SEQ_TOKENS = 2**20


def check_register(request: pb.RegisterRequest) -> None:
    """ValueError for a Register message no executor would send (nothing is changed)."""
    if request.num_blocks > MAX_NUM_BLOCKS:
        raise ValueError(f"num_blocks: must be <= {MAX_NUM_BLOCKS}, got {request.num_blocks}")
    if request.block_size > MAX_BLOCK_SIZE:
        raise ValueError(f"block_size: must be <= {MAX_BLOCK_SIZE}, got {request.block_size}")
    for live in request.live_sequences:
        _check_tokens("live_sequences", live.seq_id, len(live.token_ids))


def check_step(request: pb.StepRequest) -> None:
    """ValueError for a Step whose token lists are past any model's context."""
    for admit in request.admits:
        _check_tokens("admits", admit.seq_id, len(admit.token_ids))
    for append in request.appends:
        _check_tokens("appends", append.seq_id, len(append.token_ids))


def _check_tokens(what: str, seq_id: str, count: int) -> None:
    if count > MAX_SEQ_TOKENS:
        raise ValueError(
            f"{what}: seq_id {seq_id!r} has {count} token ids (at most {MAX_SEQ_TOKENS})"
        )


class MemoryManagerServicer(pb_grpc.MemoryManagerServicer):  # type: ignore[misc]
    """Register, Step, Deregister, GetStats and GetBlockStates over the executors' block managers."""

    def __init__(
        self,
        pools: ExecutorPools,
        publisher: PrefixPublisher | None,
        metrics: ManagerMetrics,
        manager_id: str,
        log_prompts: bool = False,
        pull_lease_s: float = 10.0,
    ) -> None:
        self.pools = pools
        self.publisher = publisher
        self.metrics = metrics
        self.manager_id = manager_id
        self.log_prompts = log_prompts  # log admitted token ids
        # Pins name this instance, not just the manager's id: a restart (same id) holds none.
        self.pulls = PullBroker(pools, f"{manager_id}/{uuid.uuid4().hex[:12]}", pull_lease_s)

    async def Register(  # noqa: N802 (gRPC method name)
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterResponse:
        """Create or replace the executor's pool, rebuilt from its live sequences."""
        try:
            check_register(request)
            live = [live_from_proto(message) for message in request.live_sequences]
            pool, old = self.pools.register(
                request.executor_id,
                request.epoch,
                request.num_blocks,
                request.block_size,
                request.enable_prefix_caching,
                request.address,
                live,
                request.accepts_pulls,
                request.sliding_window if request.HasField("sliding_window") else None,
                tuple(w or None for w in request.group_windows),
            )
        except ValueError as exc:
            await self._abort(context, "Register", grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except StaleEpochError as exc:
            await self._abort(context, "Register", grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if old is not None:
            self.pulls.forget_executor(old.executor_id, old.epoch)
        # The new pool's index is published whole; the key of a replaced epoch is deleted.
        pool.manager.drain_index_events()
        if self.publisher is not None:
            self.publisher.reset(pool.executor_id, pool.epoch, pool.manager.indexed_hashes())
        self.metrics.update_pools(self.pools)
        log.info(
            "executor registered",
            executor_id=pool.executor_id,
            epoch=pool.epoch,
            address=pool.address,
            num_blocks=pool.manager.num_blocks,
            block_size=pool.manager.block_size,
            sliding_window=pool.manager.sliding_window,
            kv_groups=pool.manager.num_groups,
            num_live_sequences=len(live),
            replaced_epoch=None if old is None else old.epoch,
        )
        return pb.RegisterResponse(manager_id=self.manager_id, instance_id=self.pulls.granted_by)

    async def Step(  # noqa: N802
        self, request: pb.StepRequest, context: grpc.aio.ServicerContext
    ) -> pb.StepResponse:
        """Apply one engine step of one executor, then queue its prefix-index changes."""
        start = time.perf_counter()
        pool = await self._pool(request.executor_id, request.epoch, context, "Step")
        try:
            check_step(request)
            result = self.pulls.step(pool, step_from_proto(request))
        except ValueError as exc:
            log.warning("malformed step", executor_id=pool.executor_id, error=str(exc))
            await self._abort(context, "Step", grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        added, removed = pool.manager.drain_index_events()
        if self.publisher is not None and (added or removed):
            self.publisher.publish(pool.executor_id, pool.epoch, added, removed)
        response = result_to_proto(result)
        self.metrics.step_seconds.observe(time.perf_counter() - start)
        self.metrics.steps.labels(pool.executor_id).inc()
        if request.admits or request.frees or request.forks or result.preempted:
            self._log_step(pool.executor_id, request, response, context)
        return response

    def _log_step(
        self,
        executor_id: str,
        request: pb.StepRequest,
        response: pb.StepResponse,
        context: grpc.aio.ServicerContext,
    ) -> None:
        """One line per step that changes who holds blocks, with the executor's request ids."""
        metadata = {key: value for key, value in context.invocation_metadata() or ()}
        ids = metadata.get("x-request-ids", "")
        request_ids = [i for i in ids.split(",") if i][:MAX_LOGGED_REQUEST_IDS]
        extra = {}
        if self.log_prompts:
            extra["admitted_token_ids"] = {a.seq_id: list(a.token_ids) for a in request.admits}
        log.info(
            "step",
            executor_id=executor_id,
            request_ids=request_ids,
            num_admitted=len(request.admits) - len(response.not_admitted),
            num_not_admitted=len(response.not_admitted),
            num_cached_tokens=sum(response.num_cached_tokens.values()),
            num_freed=len(request.frees),
            num_forked=len(request.forks),
            num_preempted=len(response.preempted),
            **extra,
        )

    async def Deregister(  # noqa: N802
        self, request: pb.DeregisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeregisterResponse:
        """Drop the executor's pool and its Redis prefix set (unknown executors: no-op)."""
        try:
            pool = self.pools.deregister(request.executor_id, request.epoch)
        except StaleEpochError as exc:
            await self._abort(context, "Deregister", grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if pool is not None:
            self.pulls.forget_executor(pool.executor_id, pool.epoch)
            if self.publisher is not None:
                self.publisher.drop(pool.executor_id, pool.epoch)
            self.metrics.forget(pool.executor_id)
            self.metrics.update_pools(self.pools)
            log.info("executor deregistered", executor_id=pool.executor_id, epoch=pool.epoch)
        return pb.DeregisterResponse()

    async def GetStats(  # noqa: N802
        self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.PoolStats:
        """Counters of the executor's pool."""
        pool = await self._any_pool(request.executor_id, context, "GetStats")
        return stats_to_proto(pool.manager.stats())

    async def GetBlockStates(  # noqa: N802
        self, request: pb.GetBlockStatesRequest, context: grpc.aio.ServicerContext
    ) -> pb.BlockStates:
        """One state byte per block of the executor's pool, and its counters."""
        pool = await self._any_pool(request.executor_id, context, "GetBlockStates")
        return pb.BlockStates(
            states=pool.manager.block_states(),
            stats=stats_to_proto(pool.manager.stats()),
            epoch=pool.epoch,
            block_size=pool.manager.block_size,
        )

    async def _any_pool(
        self, executor_id: str, context: grpc.aio.ServicerContext, method: str
    ) -> ExecutorPool:
        """The executor's pool whatever its epoch (reads), or NOT_FOUND."""
        pool = self.pools.find(executor_id)
        if pool is None:
            await self._abort(
                context,
                method,
                grpc.StatusCode.NOT_FOUND,
                f"executor not registered: {executor_id!r}",
            )
        return pool

    async def _pool(
        self, executor_id: str, epoch: int, context: grpc.aio.ServicerContext, method: str
    ) -> ExecutorPool:
        try:
            return self.pools.get(executor_id, epoch)
        except UnknownExecutorError as exc:
            await self._abort(context, method, grpc.StatusCode.NOT_FOUND, str(exc))
        except StaleEpochError as exc:
            await self._abort(context, method, grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    async def _abort(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        code: grpc.StatusCode,
        details: str,
    ) -> NoReturn:
        self.metrics.rpc_errors.labels(method, code.name).inc()
        await context.abort(code, details)
        raise AssertionError("context.abort returned")  # abort always raises
