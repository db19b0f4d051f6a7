"""A continuation over gRPC: the output it continues, under that output's index, counted from
where its tokens stop; refused when there is nothing to continue. (That its tokens are the
uninterrupted output's is tests/libs/engine/test_continuation.py's and, end to end,
tests/services/router/test_migration_stack.py's.)"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from services.executor.executor_server import ExecutorServer
from services.rpc import executor_pb2 as pb
from services.rpc import executor_pb2_grpc
from tests.services.conftest import LoopThread
from tests.services.executor.test_generate import (
    PROMPT,
    generate,
    request_ignoring_eos,
    target,
    wait_idle,
)


def continuing(
    request_id: str, index: int, token_ids: list[int], **params: Any
) -> pb.GenerateRequest:
    request = request_ignoring_eos(request_id, **params)
    request.continuation.CopyFrom(
        pb.Continuation(output_index=index, token_ids=token_ids, cumulative_logprob=-2.5)
    )
    return request


def test_a_continuation_streams_its_output_under_its_index(
    aio: LoopThread, local_executor: ExecutorServer
) -> None:
    request = continuing(
        "cont", 2, [17, 18, 19], n=3, temperature=1.0, seed=7, max_tokens=8, logprobs=0
    )
    result = aio.run(generate(target(local_executor), request))
    assert list(result.outputs) == [2]
    out = result.outputs[2]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"  # 8 - the 3 it had
    assert all(m.num_prompt_tokens == len(PROMPT) for m in result.messages)
    # The cumulative logprob goes on from the one the continued tokens had.
    first = result.messages[0].outputs[0]
    assert first.cumulative_logprob == pytest.approx(-2.5 + first.logprobs[0].logprob, abs=1e-5)
    aio.run(wait_idle(target(local_executor)))


def test_an_aborted_continuation_ends_only_its_output(
    aio: LoopThread, local_executor: ExecutorServer
) -> None:
    address = target(local_executor)

    async def body() -> pb.GenerateResponse:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = executor_pb2_grpc.ExecutorStub(channel)
            call = stub.Generate(continuing("cont-abort", 1, [5], n=2, max_tokens=500))
            await call.read()
            assert (await stub.Abort(pb.AbortRequest(request_id="cont-abort"))).found
            last = None
            while (message := await call.read()) is not grpc.aio.EOF:
                last = message
            assert last is not None
            return last

    last = aio.run(body())
    assert last.finished and [(d.index, d.finish_reason) for d in last.outputs] == [(1, "abort")]
    aio.run(wait_idle(address))


@pytest.mark.parametrize(
    ("index", "token_ids", "message"),
    [(3, [5], "output_index 3"), (0, [5, 6, 7, 8], "already has 4 of its 4 max_tokens")],
)
def test_nothing_to_continue_is_invalid_argument(
    aio: LoopThread, local_executor: ExecutorServer, index: int, token_ids: list[int], message: str
) -> None:
    request = continuing("cont-bad", index, token_ids, n=3, max_tokens=4)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        aio.run(generate(target(local_executor), request))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (error.value.details() or "")
