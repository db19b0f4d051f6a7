"""The Executor gRPC service in-process (local BlockManager): streams equal the offline LLM."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import generate_latest

from quire import LLM, SamplingParams
from services.executor.executor_server import ExecutorServer
from services.rpc import executor_pb2 as pb
from services.rpc import executor_pb2_grpc
from tests.services.conftest import LoopThread
from tests.services.executor.conftest import NUM_KV_BLOCKS

PROMPT = [1, 412, 87, 1024, 9, 3301, 77, 18, 250, 4001, 6]


@dataclass
class Streamed:
    """Deltas of one output index, concatenated."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    stop_token_id: int | None = None
    num_logprobs: int = 0


@dataclass
class StreamResult:
    outputs: dict[int, Streamed]
    messages: list[pb.GenerateResponse]


@pytest.fixture(scope="module")
def offline(tiny_model: Path) -> LLM:
    return LLM(model=str(tiny_model), num_kv_blocks=NUM_KV_BLOCKS)


def target(server: ExecutorServer) -> str:
    return f"127.0.0.1:{server.port}"


def request_ignoring_eos(
    request_id: str, prompt: list[int] = PROMPT, **params: Any
) -> pb.GenerateRequest:
    """A Generate request whose outputs run to max_tokens (EOS ignored), with `params`."""
    return pb.GenerateRequest(
        request_id=request_id,
        prompt_token_ids=prompt,
        params=pb.SamplingParams(ignore_eos=True, **params),
    )


async def generate(address: str, request: pb.GenerateRequest) -> StreamResult:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = executor_pb2_grpc.ExecutorStub(channel)
        outputs: dict[int, Streamed] = {}
        messages = []
        async for message in stub.Generate(request):
            messages.append(message)
            for delta in message.outputs:
                out = outputs.setdefault(delta.index, Streamed())
                assert not out.finish_reason, "a delta arrived after the output finished"
                out.token_ids += delta.token_ids
                out.finish_reason = delta.finish_reason
                if delta.HasField("stop_token_id"):
                    out.stop_token_id = delta.stop_token_id
                out.num_logprobs += len(delta.logprobs)
        return StreamResult(outputs, messages)


async def status(address: str) -> pb.ExecutorStatus:
    async with grpc.aio.insecure_channel(address) as channel:
        return await executor_pb2_grpc.ExecutorStub(channel).GetStatus(pb.GetStatusRequest())


async def wait_idle(address: str, timeout: float = 10.0) -> pb.ExecutorStatus:
    deadline = time.monotonic() + timeout
    while True:
        st = await status(address)
        if (st.load.num_running, st.load.num_waiting, st.load.kv_blocks_used) == (0, 0, 0):
            return st
        assert time.monotonic() < deadline, f"executor not idle: {st}"
        await asyncio.sleep(0.05)


def assert_same_as_offline(result: StreamResult, offline: LLM, params: SamplingParams) -> None:
    [expected] = offline.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)
    assert sorted(result.outputs) == [o.index for o in expected.outputs]
    for want in expected.outputs:
        got = result.outputs[want.index]
        assert got.token_ids == want.token_ids
        assert got.finish_reason == want.finish_reason
        assert got.stop_token_id == want.stop_reason
    assert [m.finished for m in result.messages] == [False] * (len(result.messages) - 1) + [True]
    assert all(m.num_prompt_tokens == len(PROMPT) for m in result.messages)


def test_greedy_stream_equals_offline(
    aio: LoopThread, local_executor: ExecutorServer, offline: LLM
) -> None:
    request = request_ignoring_eos("greedy", temperature=0.0, max_tokens=24, logprobs=3)
    result = aio.run(generate(target(local_executor), request))
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3)
    assert_same_as_offline(result, offline, params)
    # One message per engine step: the first carries the first token, then one each.
    assert len(result.messages) == 24
    assert result.outputs[0].num_logprobs == 24
    assert all(len(m.outputs[0].logprobs[0].top) == 3 for m in result.messages)


def test_n3_returns_three_outputs(
    aio: LoopThread, local_executor: ExecutorServer, offline: LLM
) -> None:
    request = request_ignoring_eos("n3", n=3, temperature=1.0, seed=7, max_tokens=8)
    result = aio.run(generate(target(local_executor), request))
    assert sorted(result.outputs) == [0, 1, 2]
    assert all(
        len(o.token_ids) == 8 and o.finish_reason == "length" for o in result.outputs.values()
    )
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    assert_same_as_offline(result, offline, params)


def test_stop_token_id_ends_with_stop(
    aio: LoopThread, local_executor: ExecutorServer, offline: LLM
) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    [full] = offline.generate([{"prompt_token_ids": PROMPT}], greedy, use_tqdm=False)
    stop_id = full.outputs[0].token_ids[5]
    request = request_ignoring_eos(
        "stop-id", temperature=0.0, max_tokens=24, stop_token_ids=[stop_id]
    )
    result = aio.run(generate(target(local_executor), request))
    out = result.outputs[0]
    assert (out.finish_reason, out.stop_token_id) == ("stop", stop_id)
    first = full.outputs[0].token_ids.index(stop_id)
    assert out.token_ids == full.outputs[0].token_ids[: first + 1]


def test_abort_of_some_outputs_ends_only_those(
    aio: LoopThread, local_executor: ExecutorServer
) -> None:
    """What the router sends when a stop string matched one output of n."""
    request = request_ignoring_eos("partial-abort", n=2, temperature=1.0, seed=3, max_tokens=40)

    async def run() -> tuple[dict[int, Streamed], bool]:
        async with grpc.aio.insecure_channel(target(local_executor)) as channel:
            stub = executor_pb2_grpc.ExecutorStub(channel)
            outputs: dict[int, Streamed] = {}
            found = False
            async for message in stub.Generate(request):
                for delta in message.outputs:
                    out = outputs.setdefault(delta.index, Streamed())
                    out.token_ids += delta.token_ids
                    out.finish_reason = delta.finish_reason
                if not found and len(outputs.get(0, Streamed()).token_ids) >= 3:
                    abort = pb.AbortRequest(request_id="partial-abort", indices=[0])
                    found = (await stub.Abort(abort)).found
            return outputs, found

    outputs, found = aio.run(run())
    assert found
    assert outputs[0].finish_reason == "abort" and len(outputs[0].token_ids) < 40
    assert outputs[1].finish_reason == "length" and len(outputs[1].token_ids) == 40
    assert aio.run(wait_idle(target(local_executor))).load.kv_blocks_used == 0


def test_cancelled_stream_frees_its_blocks(aio: LoopThread, local_executor: ExecutorServer) -> None:
    address = target(local_executor)

    async def body() -> pb.ExecutorStatus:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = executor_pb2_grpc.ExecutorStub(channel)
            call = stub.Generate(
                request_ignoring_eos(
                    "cancel-me", prompt=PROMPT * 4, temperature=0.0, max_tokens=500
                )
            )
            for _ in range(3):
                await call.read()
            busy = await status(address)
            assert busy.load.num_running == 1 and busy.load.kv_blocks_used > 0
            call.cancel()
        return await wait_idle(address)

    idle = aio.run(body())
    assert idle.load.kv_blocks_total == NUM_KV_BLOCKS


def test_abort_rpc_ends_stream_with_abort(aio: LoopThread, local_executor: ExecutorServer) -> None:
    address = target(local_executor)

    async def body() -> tuple[bool, list[pb.GenerateResponse], bool]:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = executor_pb2_grpc.ExecutorStub(channel)
            call = stub.Generate(
                request_ignoring_eos("abort-me", n=2, temperature=0.0, max_tokens=500)
            )
            first = await call.read()
            found = (await stub.Abort(pb.AbortRequest(request_id="abort-me"))).found
            rest = []
            while (message := await call.read()) is not grpc.aio.EOF:
                rest.append(message)
            again = (await stub.Abort(pb.AbortRequest(request_id="abort-me"))).found
            return found, [first, *rest], again

    found, messages, again = aio.run(body())
    assert found and not again
    last = messages[-1]
    assert last.finished
    assert sorted((d.index, d.finish_reason) for d in last.outputs) == [(0, "abort"), (1, "abort")]
    aio.run(wait_idle(address))


def test_duplicate_request_id_is_already_exists(
    aio: LoopThread, local_executor: ExecutorServer
) -> None:
    address = target(local_executor)
    request = request_ignoring_eos("twice", temperature=0.0, max_tokens=500)

    async def body() -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = executor_pb2_grpc.ExecutorStub(channel)
            first = stub.Generate(request)
            await first.read()
            try:
                async for _ in stub.Generate(request):
                    pass
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
            else:
                raise AssertionError("the duplicate id was accepted")
            first.cancel()
            return code

    assert aio.run(body()) == grpc.StatusCode.ALREADY_EXISTS
    aio.run(wait_idle(address))


def test_status_and_health(aio: LoopThread, local_executor: ExecutorServer) -> None:
    address = target(local_executor)

    async def body() -> tuple[pb.ExecutorStatus, int]:
        async with grpc.aio.insecure_channel(address) as channel:
            st = await executor_pb2_grpc.ExecutorStub(channel).GetStatus(pb.GetStatusRequest())
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service="quire.v1.Executor"))
            return st, reply.status

    st, health = aio.run(body())
    assert health == health_pb2.HealthCheckResponse.SERVING
    assert st.executor_id == "test-executor"
    assert st.model == "quire-tiny"
    assert st.epoch == local_executor.epoch > 0
    assert st.load.kv_blocks_total == NUM_KV_BLOCKS
    assert not st.draining


def test_metrics_use_vllm_names_with_quire_prefix(
    aio: LoopThread, local_executor: ExecutorServer
) -> None:
    request = request_ignoring_eos("metrics", temperature=0.0, max_tokens=4)
    aio.run(generate(target(local_executor), request))
    aio.run(wait_idle(target(local_executor)))
    assert local_executor.metrics is not None
    text = generate_latest(local_executor.metrics.registry).decode()
    for name in (
        "quire_executor_num_requests_running",
        "quire_executor_num_requests_waiting",
        "quire_executor_kv_cache_usage_perc",
        "quire_executor_num_preemptions_total",
        "quire_executor_prompt_tokens_total",
        "quire_executor_generation_tokens_total",
        "quire_executor_time_to_first_token_seconds_count",
        "quire_executor_e2e_request_latency_seconds_count",
    ):
        assert f'{name}{{model_name="quire-tiny"' in text, name
    samples = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("quire_executor_") and "_total{" in line
    }
    assert samples["quire_executor_prompt_tokens_total"] >= len(PROMPT)
    assert samples["quire_executor_generation_tokens_total"] >= 4
