"""quire.v1.Executor over grpc.aio: a thin translator in front of the engine loop."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from quire.outputs import RequestDelta
from quire.sampling_params import SamplingParams
from services.common.wire.executor import (
    aborted_response,
    continuation_from_proto,
    delta_to_proto,
    load_to_proto,
    params_from_proto,
)
from services.executor.block_reads import ReadRefused, read_blocks
from services.executor.engine_loop import (
    Aborted,
    DuplicateRequestError,
    EngineFailure,
    EngineLoop,
    SinkEvent,
)
from services.executor.executor_logging import safe_request_id
from services.executor.prefill_role import mark_handoffs, prefill_params
from services.rpc import executor_pb2 as pb
from services.rpc import executor_pb2_grpc

log = structlog.get_logger("quire.executor.servicer")

MAX_REQUEST_ID_CHARS = 256
# The status details of a stream this executor ended at the end of its drain.
HANDED_OFF = "draining: grace period over, continue elsewhere"


@dataclass(frozen=True)
class ExecutorIdentity:
    """Who this executor is, as GetStatus and the liveness record report it."""

    executor_id: str
    epoch: int
    model: str
    address: str


class ExecutorServicer(executor_pb2_grpc.ExecutorServicer):
    """Generate / Abort / GetStatus. Refuses new work once `draining` is set; once
    `handing_off` is set too, a request aborted here ends its stream with UNAVAILABLE (the
    router continues it elsewhere) instead of an "abort" finish."""

    def __init__(
        self,
        loop: EngineLoop,
        identity: ExecutorIdentity,
        log_prompts: bool = False,
        role: str = "both",
    ) -> None:
        self.loop = loop
        self.identity = identity
        self.log_prompts = log_prompts  # log prompt and output token ids (and output text)
        self.role = role  # --role: "prefill" hands new requests on after their first token
        self.draining = False
        self.handing_off = False
        self.num_active_streams = 0
        self._streams_done = asyncio.Event()
        self._streams_done.set()

    async def wait_streams_done(self) -> None:
        """Return once no Generate stream is open."""
        await self._streams_done.wait()

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "draining")
        try:
            params = params_from_proto(request.params)
            self._check_limits(request, params)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        request_id = request.request_id or f"exec-{uuid.uuid4().hex}"
        prompt_token_ids = list(request.prompt_token_ids)
        continuation = continuation_from_proto(request)
        # The caller's request id (the router's x-request-id) names the request in the logs
        # here and at the memory manager; the engine keeps the unique Generate request_id.
        metadata = dict(context.invocation_metadata() or ())
        trace_id = (
            safe_request_id(metadata.get("x-request-id"))
            or safe_request_id(request_id)
            or uuid.uuid4().hex
        )
        rlog = log.bind(request_id=trace_id, engine_request_id=request_id)
        events: asyncio.Queue[SinkEvent] = asyncio.Queue()
        event_loop = asyncio.get_running_loop()

        def sink(event: SinkEvent) -> None:  # called on the engine thread
            # RuntimeError: the event loop is closed, nobody is listening.
            with contextlib.suppress(RuntimeError):
                event_loop.call_soon_threadsafe(events.put_nowait, event)

        run_params = None
        if self.role == "prefill" and continuation is None:
            run_params = prefill_params(
                params, len(prompt_token_ids), self.loop.engine.max_model_len
            )
        self._open_stream()
        submitted = finished = False
        try:
            future = self.loop.add(
                request_id, prompt_token_ids, run_params or params, sink, trace_id, continuation
            )
            submitted = True
            try:
                await asyncio.wrap_future(future)
            except DuplicateRequestError as exc:
                submitted = False
                await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
            except ValueError as exc:
                submitted = False
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            continued = {}
            if continuation is not None:
                continued = {
                    "continues_output": continuation.output_index,
                    "num_continued_tokens": len(continuation.token_ids),
                }
            rlog.info(
                "request added",
                num_prompt_tokens=len(prompt_token_ids),
                **continued,
                **({"prompt_token_ids": prompt_token_ids} if self.log_prompts else {}),
            )
            indices = range(params.n) if continuation is None else [continuation.output_index]
            progress = _StreamProgress(params, indices, prompt_token_ids, self.log_prompts)
            while not finished:
                event = await events.get()
                if isinstance(event, EngineFailure):
                    finished = True
                    await context.abort(grpc.StatusCode.INTERNAL, event.message)
                if isinstance(event, Aborted):
                    finished = True
                    if self.handing_off:
                        rlog.info("request handed back to the router")
                        await context.abort(grpc.StatusCode.UNAVAILABLE, HANDED_OFF)
                    rlog.info("request aborted")
                    yield progress.aborted(len(prompt_token_ids))
                    return
                assert isinstance(event, RequestDelta)
                response = progress.response(event)
                if run_params is not None:
                    mark_handoffs(response)
                finished = event.finished
                if finished:
                    # Before the last yield: the caller may cancel the call once it has it.
                    self._log_finished(rlog, progress)
                yield response
        finally:
            if submitted and not finished:
                # The client went away (or the stream failed): free the request's blocks.
                rlog.info("stream closed early; aborting")
                self._abort_quietly(request_id)
            self._close_stream()

    def _check_limits(self, request: pb.GenerateRequest, params: SamplingParams) -> None:
        """ValueError for what the engine would accept but cannot mean (checked before it)."""
        if len(request.request_id) > MAX_REQUEST_ID_CHARS:
            raise ValueError(f"request_id is longer than {MAX_REQUEST_ID_CHARS} characters")
        max_model_len = self.loop.engine.max_model_len
        if params.max_tokens > max_model_len:
            raise ValueError(
                f"max_tokens {params.max_tokens} is more than the model's context "
                f"of {max_model_len} tokens"
            )

    def _log_finished(self, rlog: Any, progress: _StreamProgress) -> None:
        rlog.info(
            "request finished",
            num_output_tokens=progress.num_output_tokens,
            finish_reasons=list(progress.finish_reasons.values()),
            num_cached_tokens=progress.num_cached_tokens,
            **({"output_token_ids": progress.token_ids} if self.log_prompts else {}),
        )

    async def Abort(
        self, request: pb.AbortRequest, context: grpc.aio.ServicerContext
    ) -> pb.AbortResponse:
        indices = tuple(request.indices)
        try:
            found = await asyncio.wrap_future(self.loop.abort(request.request_id, indices))
        except RuntimeError:  # the loop stopped, which aborted everything
            found = False
        log.info("abort", engine_request_id=request.request_id, indices=indices, found=found)
        return pb.AbortResponse(found=found)

    async def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExecutorStatus:
        try:
            load = await asyncio.wrap_future(self.loop.fresh_load())
        except RuntimeError:  # the loop stopped: its last load is final
            load = self.loop.load
        return pb.ExecutorStatus(
            executor_id=self.identity.executor_id,
            epoch=self.identity.epoch,
            model=self.identity.model,
            load=load_to_proto(load),
            draining=self.draining,
        )

    async def ReadBlocks(  # noqa: N802
        self, request: pb.ReadBlocksRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.BlockData]:
        """A peer copies blocks pinned here for it (services/executor/block_reads.py)."""
        engine = self.loop.engine
        try:
            # On the engine thread, between steps or while a step waits on a pull (copies and
            # checksums off the event loop, and no second thread running torch's parallel work:
            # services/executor/peer_reads.py)
            read = self.loop.reads.submit(
                lambda: read_blocks(engine.runner.kv, engine.allocator, request)
            )
        except RuntimeError:  # the loop stopped: this executor is going away
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the executor is stopping")
        try:
            messages = await asyncio.wrap_future(read)
        except ReadRefused as exc:
            code = grpc.StatusCode.FAILED_PRECONDITION
            if not exc.precondition:
                code = grpc.StatusCode.INVALID_ARGUMENT
            log.warning("block read refused", error=str(exc))
            await context.abort(code, str(exc))
        for message in messages:
            yield message

    def _abort_quietly(self, request_id: str) -> None:
        # RuntimeError: the loop already stopped, which aborted everything.
        with contextlib.suppress(RuntimeError):
            self.loop.abort(request_id)

    def _open_stream(self) -> None:
        self.num_active_streams += 1
        self._streams_done.clear()

    def _close_stream(self) -> None:
        self.num_active_streams -= 1
        if self.num_active_streams == 0:
            self._streams_done.set()


class _StreamProgress:
    """What one Generate stream has sent: per output its finish, and (for logs) its tokens."""

    def __init__(
        self,
        params: SamplingParams,
        indices: Iterable[int],
        prompt_token_ids: list[int],
        keep_token_ids: bool,
    ) -> None:
        """`indices`: the outputs the stream runs (all n, or the one a continuation runs)."""
        self.num_top_logprobs = params.logprobs or 0
        self.num_prompt_top_logprobs = params.prompt_logprobs or 0
        self.prompt_token_ids = prompt_token_ids
        self.num_output_tokens = 0
        # Kept only when prompts and outputs are logged; otherwise the count is enough.
        self.token_ids: dict[int, list[int]] | None = (
            {i: [] for i in indices} if keep_token_ids else None
        )
        self.finish_reasons: dict[int, str | None] = dict.fromkeys(indices)
        self.num_cached_tokens = 0

    def response(self, delta: RequestDelta) -> pb.GenerateResponse:
        self.num_cached_tokens = delta.num_cached_tokens
        for seq in delta.outputs:
            self.num_output_tokens += len(seq.new_token_ids)
            if self.token_ids is not None:
                self.token_ids[seq.index].extend(seq.new_token_ids)
            if seq.finish_reason is not None:
                self.finish_reasons[seq.index] = seq.finish_reason
        return delta_to_proto(
            delta, self.num_top_logprobs, self.prompt_token_ids, self.num_prompt_top_logprobs
        )

    def aborted(self, num_prompt_tokens: int) -> pb.GenerateResponse:
        unfinished = [i for i, reason in self.finish_reasons.items() if reason is None]
        return aborted_response(unfinished, num_prompt_tokens, self.num_cached_tokens)
