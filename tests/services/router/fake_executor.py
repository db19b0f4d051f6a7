"""A test double of the executor: a real grpc.aio server streaming scripted tokens.

It speaks quire.v1.Executor exactly as the real one does on the wire (one response per
"step", the last with finished = true; cancelling the call aborts it; a continuation plays its
output from where its tokens stop, under its own index), but instead of a model it plays a
`Script`. Every request and every cancellation is recorded for assertions.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc

from services.rpc import executor_pb2 as pb
from services.rpc import executor_pb2_grpc

EOS = 2


@dataclass
class Script:
    """What the fake answers to the next Generate calls."""

    tokens: list[int] = field(default_factory=list)  # per output; EOS at the end = "stop"
    tokens_by_index: dict[int, list[int]] = field(default_factory=dict)  # overrides `tokens`
    tokens_per_message: int = 1
    delay_s: float = 0.0  # pause after each message
    first_delay_s: float = 0.0  # "queued / prefilling" time before the first message
    num_cached_tokens: int = 0
    error: grpc.StatusCode | None = None  # abort with this before any output
    error_message: str = "scripted failure"
    # The executor is lost after this many messages of a first call (and of continuations
    # too with `fail_continuations`): the call ends with `fail_code`, or without a status
    # (the stream just ends) when that is None.
    fail_after: int | None = None
    fail_continuations: bool = False
    fail_code: grpc.StatusCode | None = grpc.StatusCode.UNAVAILABLE


class FakeExecutor(executor_pb2_grpc.ExecutorServicer):
    """Plays `script` for every Generate call."""

    def __init__(self, executor_id: str) -> None:
        self.executor_id = executor_id
        self.script = Script()
        self.requests: list[pb.GenerateRequest] = []
        self.cancelled: list[str] = []
        self.completed: list[str] = []
        self.failed: list[str] = []  # calls ended by `Script.fail_after`
        self.aborts: list[tuple[str, list[int]]] = []  # (request id, indices) of Abort calls

    def reset(self, script: Script) -> None:
        self.script = script
        self.requests.clear()
        self.cancelled.clear()
        self.completed.clear()
        self.failed.clear()
        self.aborts.clear()

    async def Generate(  # noqa: N802 (gRPC method name)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ):  # type: ignore[no-untyped-def]
        self.requests.append(request)
        script = self.script
        if script.error is not None:
            await context.abort(script.error, script.error_message)
        params = request.params
        n = params.n or 1
        max_tokens = params.max_tokens or 16
        played = range(n)
        done_before = 0  # tokens a continuation's output already has
        if request.HasField("continuation"):
            played = range(request.continuation.output_index, request.continuation.output_index + 1)
            done_before = len(request.continuation.token_ids)
        per_index = {
            i: script.tokens_by_index.get(i, script.tokens)[done_before:max_tokens] for i in played
        }
        k = params.logprobs if params.HasField("logprobs") else None
        fail_after = script.fail_after
        if request.HasField("continuation") and not script.fail_continuations:
            fail_after = None
        try:
            if script.first_delay_s:
                await asyncio.sleep(script.first_delay_s)
            step = max(1, script.tokens_per_message)
            longest = max(len(t) for t in per_index.values())
            for num_sent, start in enumerate(range(0, longest, step)):
                if num_sent == fail_after:
                    self.failed.append(request.request_id)
                    if script.fail_code is None:
                        return
                    await context.abort(script.fail_code, "scripted loss")
                last = start + step >= longest
                outputs = []
                for index, tokens in per_index.items():
                    chunk = tokens[start : start + step]
                    if not chunk:
                        continue
                    reason = "stop" if tokens[-1] == EOS else "length"
                    done = start + step >= len(tokens)
                    delta = pb.CompletionDelta(
                        index=index, token_ids=chunk, finish_reason=reason if done else ""
                    )
                    if k is not None:
                        delta.logprobs.extend(_logprobs(t, k) for t in chunk)
                    outputs.append(delta)
                yield pb.GenerateResponse(
                    outputs=outputs,
                    finished=last,
                    num_prompt_tokens=len(request.prompt_token_ids),
                    num_cached_tokens=script.num_cached_tokens,
                )
                if script.delay_s:
                    await asyncio.sleep(script.delay_s)
            self.completed.append(request.request_id)
        except asyncio.CancelledError:
            self.cancelled.append(request.request_id)
            raise

    async def Abort(  # noqa: N802
        self, request: pb.AbortRequest, context: grpc.aio.ServicerContext
    ) -> pb.AbortResponse:
        self.aborts.append((request.request_id, list(request.indices)))
        return pb.AbortResponse(found=False)

    async def GetStatus(  # noqa: N802
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExecutorStatus:
        return pb.ExecutorStatus(executor_id=self.executor_id, model="quire-tiny")


def _logprobs(token_id: int, k: int) -> pb.TokenLogprobs:
    top = [
        pb.TopLogprob(token_id=token_id, logprob=-0.25, rank=1),
        pb.TopLogprob(token_id=(token_id + 1) % 4096, logprob=-1.5, rank=2),
    ]
    return pb.TokenLogprobs(token_id=token_id, logprob=-0.25, top=top[:k])


@dataclass
class FakeServer:
    """A started fake on 127.0.0.1:port."""

    executor: FakeExecutor
    server: grpc.aio.Server
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


async def start_fake(executor_id: str) -> FakeServer:
    """Serve a FakeExecutor on a free port (call inside the loop that will run it)."""
    server = grpc.aio.server()
    executor = FakeExecutor(executor_id)
    executor_pb2_grpc.add_ExecutorServicer_to_server(executor, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return FakeServer(executor, server, port)
