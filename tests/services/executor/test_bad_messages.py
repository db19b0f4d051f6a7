"""Generate refuses malformed or out-of-range messages with INVALID_ARGUMENT, changing nothing."""

from __future__ import annotations

import math

import grpc
import pytest

from services.executor.executor_server import ExecutorServer
from services.rpc import executor_pb2 as pb
from tests.services.conftest import LoopThread
from tests.services.executor.conftest import NUM_KV_BLOCKS
from tests.services.executor.test_generate import PROMPT, generate, status, target

U32 = 2**32 - 1  # a "negative" value sent as uint32 arrives as a huge one


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([], pb.SamplingParams(), "prompt_token_ids"),
        ([1, 4096], pb.SamplingParams(), "prompt_token_ids"),  # == vocab size
        ([1, 99999], pb.SamplingParams(), "prompt_token_ids"),
        ([5] * 4000, pb.SamplingParams(), "context"),
        ([5] * (NUM_KV_BLOCKS * 16 + 1), pb.SamplingParams(), "KV blocks"),
        (PROMPT, pb.SamplingParams(temperature=-1.0), "temperature"),
        (PROMPT, pb.SamplingParams(top_p=0.0), "top_p"),
        (PROMPT, pb.SamplingParams(logprobs=99), "logprobs"),
        ([1, U32], pb.SamplingParams(), "prompt_token_ids"),
        (PROMPT, pb.SamplingParams(n=129), "n must be"),
        (PROMPT, pb.SamplingParams(n=U32), "n must be"),
        (PROMPT, pb.SamplingParams(max_tokens=U32), "max_tokens"),
        (PROMPT, pb.SamplingParams(max_tokens=2049), "max_tokens"),
        (PROMPT, pb.SamplingParams(logprobs=21), "logprobs"),
        (PROMPT, pb.SamplingParams(logprobs=U32), "logprobs"),
        (PROMPT, pb.SamplingParams(temperature=math.nan), "temperature"),
        (PROMPT, pb.SamplingParams(temperature=math.inf), "temperature"),
        (PROMPT, pb.SamplingParams(temperature=-math.inf), "temperature"),
        (PROMPT, pb.SamplingParams(top_p=math.nan), "top_p"),
        (PROMPT, pb.SamplingParams(min_p=math.nan), "min_p"),
        (PROMPT, pb.SamplingParams(presence_penalty=math.inf), "presence_penalty"),
        (PROMPT, pb.SamplingParams(repetition_penalty=math.nan), "repetition_penalty"),
    ],
)
def test_malformed_generate_is_invalid_argument(
    aio: LoopThread,
    local_executor: ExecutorServer,
    prompt: list[int],
    params: pb.SamplingParams,
    message: str,
) -> None:
    address = target(local_executor)
    request = pb.GenerateRequest(request_id="bad", prompt_token_ids=prompt, params=params)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        aio.run(generate(address, request))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (info.value.details() or "")
    st = aio.run(status(address))
    assert (st.load.num_running, st.load.num_waiting, st.load.kv_blocks_used) == (0, 0, 0)


def test_long_request_id_is_invalid_argument(
    aio: LoopThread, local_executor: ExecutorServer
) -> None:
    request = pb.GenerateRequest(request_id="r" * 257, prompt_token_ids=PROMPT)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        aio.run(generate(target(local_executor), request))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_valid_call_after_bad_ones_works(aio: LoopThread, local_executor: ExecutorServer) -> None:
    """The refusals left no trace: the same request id is free and a normal call completes."""
    address = target(local_executor)
    bad = pb.GenerateRequest(
        request_id="again", prompt_token_ids=PROMPT, params=pb.SamplingParams(top_p=math.nan)
    )
    with pytest.raises(grpc.aio.AioRpcError):
        aio.run(generate(address, bad))
    good = pb.GenerateRequest(
        request_id="again",
        prompt_token_ids=PROMPT,
        params=pb.SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, top_k=U32),
    )
    result = aio.run(generate(address, good))
    assert len(result.outputs[0].token_ids) == 4
    assert result.messages[-1].finished
    st = aio.run(status(address))
    assert (st.load.num_running, st.load.num_waiting) == (0, 0)
