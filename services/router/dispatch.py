"""From token ids to an open executor stream: admission, routing, the call, retries.

The first response of a Generate call is awaited here, before the client sees anything: an
executor that turns out UNAVAILABLE at that point (dead process, refused connection, a
server stopping that cancels the call) is marked down for a few seconds and the request is
routed again, to another executor, at most `max_retries` times. After the first response
a lost executor raises `ExecutorLost` (services/router/executor_lost.py), and the generation
continues the stream elsewhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from dataclasses import dataclass, field

import grpc
import structlog

from quire.block.hashing import hash_full_blocks
from quire.cluster.policies import RoutingPolicy, RoutingRequest
from quire.cluster.routing import Candidate, RoutingDecision
from services.router.admission.slots import ALL_EXECUTORS_FULL, Admission, current_ticket
from services.router.directory import ClusterView, ExecutorDirectory
from services.router.errors import ApiError, from_grpc
from services.router.executor_client import ExecutorClients
from services.router.executor_lost import LOST_CODES, ExecutorLost
from services.router.hash_watch import HashWatch
from services.router.router_logging import current_request_id
from services.router.router_metrics import RouterMetrics
from services.rpc import executor_pb2, executor_pb2_grpc

log = structlog.get_logger("router.dispatch")


@dataclass(eq=False)  # compared and hashed by identity: the dispatcher keeps sets of them
class ExecutorStream:
    """A Generate call whose first response has arrived; holds one admission slot."""

    executor_id: str
    request_id: str  # the executor request's id (what Abort names)
    call: grpc.aio.UnaryStreamCall[executor_pb2.GenerateRequest, executor_pb2.GenerateResponse]
    stub: executor_pb2_grpc.ExecutorStub
    first: executor_pb2.GenerateResponse
    dispatcher: Dispatcher
    # What this call continues (a migrated output), None for a request's first call.
    continuation: executor_pb2.Continuation | None = None
    closed: bool = field(default=False)
    lost_reason: str | None = None  # set by `lose()`
    # Since when a read waits for the executor's next response (monotonic; None: no read
    # pending, the consumer has not asked yet): hung-executor detection reads it.
    read_since: float | None = None
    _aborts: set[asyncio.Task[None]] = field(default_factory=set)

    async def responses(self) -> AsyncIterator[executor_pb2.GenerateResponse]:
        """Every response, the first included, until the finished one (or `close()`).

        Raises `ExecutorLost` when the executor goes away before the finished response
        (services/router/executor_lost.py says when), `ApiError` for the request's own errors.
        """
        try:
            response = self.first
            while True:
                yield response
                if response.finished or self.closed:
                    return
                self.read_since = time.monotonic()
                following = await self.call.read()
                self.read_since = None
                if following is grpc.aio.EOF:
                    raise ExecutorLost(self.executor_id, "the stream ended before finishing")
                assert isinstance(following, executor_pb2.GenerateResponse)
                response = following
        except asyncio.CancelledError:
            # `lose()` cancelled the call under the pending read; any other cancellation
            # (the client left) goes on up.
            task = asyncio.current_task()
            if self.lost_reason is None or (task is not None and task.cancelling()):
                raise
            raise ExecutorLost(self.executor_id, self.lost_reason) from None
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                self.dispatcher.directory.mark_down(self.executor_id)
            if error.code() in LOST_CODES and not self.closed:
                raise ExecutorLost(
                    self.executor_id, f"{error.code().name}: {error.details()}"
                ) from error
            raise from_grpc(error, self.executor_id) from error
        finally:
            self.close()

    def lose(self, reason: str) -> None:
        """Declare this stream's executor lost: `responses()` raises `ExecutorLost(reason)` at
        its next read (a pending one included) instead of waiting for the executor. The call
        is cancelled, which aborts the request on the executor if it is still there."""
        if self.closed or self.lost_reason is not None:
            return
        self.lost_reason = reason
        if not self.call.done():
            self.call.cancel()

    def end_outputs(self, indices: list[int]) -> None:
        """Ask the executor to stop generating some outputs (stop strings matched here).

        Best effort, in the background: an output that is not stopped in time ends by its
        length, and whatever it makes after the stop is ignored here.
        """
        if self.closed:
            return
        request = executor_pb2.AbortRequest(request_id=self.request_id, indices=indices)
        task = asyncio.ensure_future(self._abort(request))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def _abort(self, request: executor_pb2.AbortRequest) -> None:
        try:
            await self.stub.Abort(request, timeout=5.0)
        except grpc.aio.AioRpcError as error:
            log.info("abort of stopped outputs failed", error=error.details())

    def close(self) -> None:
        """Cancel the call if it still runs (the executor aborts it) and free the slot."""
        if self.closed:
            return
        self.closed = True
        if not self.call.done():
            self.call.cancel()
        self.dispatcher.stream_closed(self)


@dataclass(eq=False)
class _FirstRead:
    """A Generate call still waiting for its first response, which `lose_executor` may end."""

    call: grpc.aio.UnaryStreamCall[executor_pb2.GenerateRequest, executor_pb2.GenerateResponse]
    started_at: float = field(default_factory=time.monotonic)
    lost_reason: str | None = None

    def lose(self, reason: str) -> None:
        self.lost_reason = reason
        self.call.cancel()

    def was_lost(self) -> bool:
        """Whether a cancellation came from `lose()`, not from the caller going away."""
        task = asyncio.current_task()
        return self.lost_reason is not None and not (task is not None and task.cancelling())


async def open_all(opens: Iterable[Awaitable[ExecutorStream]]) -> list[ExecutorStream]:
    """Await several `Dispatcher.open` calls together: all streams, or none.

    When one fails, or the caller is cancelled (the client left), every stream that opened
    (or opens later) is closed and the error raised.
    """
    tasks = [asyncio.ensure_future(opening) for opening in opens]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            if not task.done():
                task.cancel()
            task.add_done_callback(_close_if_opened)
        raise


def _close_if_opened(task: asyncio.Future[ExecutorStream]) -> None:
    if not task.cancelled() and task.exception() is None:
        task.result().close()


class Dispatcher:
    """Routes executor requests and opens their streams, within the admission bounds."""

    def __init__(
        self,
        directory: ExecutorDirectory,
        admission: Admission,
        clients: ExecutorClients,
        metrics: RouterMetrics,
        policy: RoutingPolicy,
        hash_watch: HashWatch,
        request_timeout_s: float,
        max_retries: int,
        retry_after_s: int,
        log_prompts: bool = False,
        max_migrations: int = 2,
    ) -> None:
        self.directory = directory
        self.admission = admission
        self.clients = clients
        self.metrics = metrics
        self.policy = policy
        self.hash_watch = hash_watch
        self.request_timeout_s = request_timeout_s
        self.max_retries = max_retries
        self.retry_after_s = retry_after_s
        self.log_prompts = log_prompts  # log prompt and output text of every request
        # Executor losses one HTTP request survives (services/router/executor_lost.py).
        self.max_migrations = max_migrations
        self._open_streams: dict[str, set[ExecutorStream]] = {}
        self._first_reads: dict[str, set[_FirstRead]] = {}

    def too_many(self, message: str) -> ApiError:
        self.metrics.admission_rejections.labels(code="429").inc()
        return ApiError(
            429,
            message,
            code="rate_limit_exceeded",
            headers={"Retry-After": str(self.retry_after_s)},
        )

    def unavailable(self, message: str) -> ApiError:
        self.metrics.admission_rejections.labels(code="503").inc()
        return ApiError(
            503, message, code="no_executor", headers={"Retry-After": str(self.retry_after_s)}
        )

    def check_capacity(self, num_requests: int) -> None:
        """429 unless `num_requests` more executor requests fit under the overall bound."""
        if not self.admission.can_admit(num_requests, current_ticket.get()):
            raise self.too_many(self.admission.overall_full_message())

    async def route(
        self, prompt_ids: Sequence[int], tried: set[str], phase: str = "prefill"
    ) -> RoutingDecision:
        """Choose an executor with a free admission slot by the policy, or raise 503/429.

        `phase` is "prefill" for a new request and "decode" for a continuation: executors
        whose --role takes that phase are chosen from while any of them may be (otherwise
        any executor, which serves the request whole)."""
        view = await self.directory.view()
        down = self.directory.down_executors()
        usable = [
            r
            for r in view.records
            if not r.draining and r.executor_id not in down and r.executor_id not in tried
        ]
        if not usable:
            raise self.unavailable("no live executor can take the request")
        usable = [r for r in usable if r.serves(phase)] or usable
        self.check_capacity(1)
        exclude = tried | down | self.admission.full_executors()
        agreement = self.hash_watch.agreement(view)
        params = agreement.params
        block_hashes = hash_full_blocks(prompt_ids, params.block_size, params.extra_key)
        hits: dict[str, int] = {}
        if self.policy.uses_prefix_cache:
            # Only executors hashing like the router can hold these hashes.
            agreeing = [r for r in usable if r.executor_id in agreement.agreeing]
            hits = await self.directory.prefix_hits(
                ClusterView(agreeing, view.source), block_hashes
            )
        candidates = [
            Candidate(r, hits.get(r.executor_id, 0), self.admission.pending(r.executor_id))
            for r in usable
        ]
        request = RoutingRequest(prompt_ids, block_hashes, params.block_size, time.monotonic())
        decision = self.policy.choose(candidates, request, exclude)
        if decision is None:
            raise self.too_many(ALL_EXECUTORS_FULL)
        self.metrics.routing_decisions.labels(reason=decision.reason).inc()
        log.debug(
            "routed",
            executor_id=decision.executor_id,
            policy=self.policy.name,
            reason=decision.reason,
            cached_tokens=decision.num_cached_tokens,
            source=view.source,
        )
        return decision

    async def open(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: executor_pb2.SamplingParams,
        arrival: float,
        continuation: executor_pb2.Continuation | None = None,
        avoid: Sequence[str] = (),
    ) -> ExecutorStream:
        """Route, call Generate and wait for the first response, retrying on UNAVAILABLE.

        With `continuation`, the call continues one output whose executor was lost: it is
        routed on the prompt and the output's tokens so far (the prefix it will look up),
        never to an executor in `avoid`.
        """
        request = executor_pb2.GenerateRequest(
            request_id=request_id,
            prompt_token_ids=prompt_ids,
            params=params,
            continuation=continuation,
        )
        routed_ids = prompt_ids
        if continuation is not None:
            routed_ids = [*prompt_ids, *continuation.token_ids]
        # The HTTP request's id (x-request-id) names it in the executor's and the memory
        # manager's logs; `request_id` (unique per executor request) is the engine's id.
        metadata = (("x-request-id", current_request_id() or request_id),)
        tried: set[str] = set(avoid)
        for attempt in range(self.max_retries + 1):
            phase = "prefill" if continuation is None else "decode"
            decision = await self.route(routed_ids, tried, phase)
            if not self.admission.try_acquire(decision.executor_id, current_ticket.get()):
                raise self.too_many("the chosen executor filled up meanwhile; retry later")
            self.metrics.in_flight.inc()
            stub = self.clients.stub(decision.address)
            call = stub.Generate(
                request,
                timeout=self.request_timeout_s,
                metadata=metadata,
            )
            pending = _FirstRead(call)
            self._first_reads.setdefault(decision.executor_id, set()).add(pending)
            try:
                first = await call.read()
            except (grpc.aio.AioRpcError, asyncio.CancelledError) as error:
                self.release(decision.executor_id)
                if isinstance(error, asyncio.CancelledError) and not pending.was_lost():
                    call.cancel()
                    raise
                if isinstance(error, grpc.aio.AioRpcError):
                    # CANCELLED that the router did not ask for (that would have raised
                    # CancelledError): an executor whose server is stopping (the end of a
                    # drain) cancels a call that reached it too late.
                    if error.code() not in LOST_CODES:
                        raise from_grpc(error, decision.executor_id) from error
                    self.directory.mark_down(decision.executor_id)
                tried.add(decision.executor_id)
                self.metrics.executor_retries.inc()
                log.warning(
                    "executor unavailable, rerouting",
                    executor_id=decision.executor_id,
                    attempt=attempt,
                    error=error.details()
                    if isinstance(error, grpc.aio.AioRpcError)
                    else pending.lost_reason,
                )
                continue
            except BaseException:
                call.cancel()
                self.release(decision.executor_id)
                raise
            finally:
                self._forget_first_read(decision.executor_id, pending)
            if first is grpc.aio.EOF:
                self.release(decision.executor_id)
                raise ApiError(502, f"executor {decision.executor_id} returned no output")
            assert isinstance(first, executor_pb2.GenerateResponse)
            if continuation is None:  # a continuation's first token is no request's first
                self.metrics.ttft.observe(time.monotonic() - arrival)
                self.metrics.observe_prompt(first.num_prompt_tokens, first.num_cached_tokens)
            stream = ExecutorStream(
                decision.executor_id, request_id, call, stub, first, self, continuation
            )
            self._open_streams.setdefault(decision.executor_id, set()).add(stream)
            return stream
        raise self.unavailable(f"no executor answered after {self.max_retries + 1} attempts")

    def lose_executor(self, executor_id: str, reason: str) -> int:
        """Declare an executor lost: mark it down and `lose()` every open stream on it (their
        generations migrate them). Returns how many streams were open there."""
        self.directory.mark_down(executor_id)
        for pending in list(self._first_reads.get(executor_id, ())):
            pending.lose(reason)  # `open` routes the request again
        streams = list(self._open_streams.get(executor_id, ()))
        for stream in streams:
            stream.lose(reason)
        if streams:
            log.warning(
                "executor lost", executor_id=executor_id, reason=reason, num_streams=len(streams)
            )
        return len(streams)

    def executors_with_streams(self) -> set[str]:
        """Executors this router has open streams on."""
        return {e for e, streams in self._open_streams.items() if streams}

    def waiting_reads(self) -> dict[str, float]:
        """Executors this router waits on, each with since when its oldest pending read (a
        first response included) has waited. A stream whose consumer has not asked for more
        waits on nobody."""
        since: dict[str, list[float]] = {}
        for executor_id, streams in self._open_streams.items():
            for stream in streams:
                if stream.read_since is not None:
                    since.setdefault(executor_id, []).append(stream.read_since)
        for executor_id, pending_reads in self._first_reads.items():
            since.setdefault(executor_id, []).extend(p.started_at for p in pending_reads)
        return {executor_id: min(times) for executor_id, times in since.items()}

    def _forget_first_read(self, executor_id: str, pending: _FirstRead) -> None:
        pending_reads = self._first_reads.get(executor_id)
        if pending_reads is not None:
            pending_reads.discard(pending)
            if not pending_reads:
                del self._first_reads[executor_id]

    def stream_closed(self, stream: ExecutorStream) -> None:
        """A stream's call is over: forget it and free its admission slot."""
        streams = self._open_streams.get(stream.executor_id)
        if streams is not None:
            streams.discard(stream)
            if not streams:
                del self._open_streams[stream.executor_id]
        self.release(stream.executor_id)

    def release(self, executor_id: str) -> None:
        self.admission.release(executor_id)
        self.metrics.in_flight.dec()
