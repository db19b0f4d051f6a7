"""Executor processes against a real memory manager and a real redis-server.

Liveness: the record appears with the right fields and vanishes within LIVENESS_TTL_S of a
SIGKILL; its step counter advances while it works. Drain: SIGTERM during a stream lets it
finish, then the process exits 0 and cleans up after itself (Redis record, memory-manager
registration); a stream still running when the grace period ends is handed back with
UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quire.cluster.redis_keys import LIVENESS_TTL_S, ExecutorRecord, executor_key, executors_key
from services.executor.executor_servicer import HANDED_OFF
from services.rpc import executor_pb2 as pb
from services.rpc import executor_pb2_grpc, memory_manager_pb2, memory_manager_pb2_grpc
from services.stack.ports import free_port
from tests.services.conftest import RedisServer, ServiceProcess, wait_for

PREFIX = "quire-test"
NUM_KV_BLOCKS = 128


@pytest.fixture
def redis_client(shared_redis: RedisServer) -> Iterator[redis.Redis]:
    client = shared_redis.client()
    yield client
    client.close()


class Executor:
    """One `python -m services.executor` process, SERVING once constructed."""

    def __init__(
        self,
        tiny_model: Path,
        memory_manager: str,
        redis_url: str,
        log_path: Path,
        name: str,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        port = free_port()
        self.executor_id = name
        self.address = f"127.0.0.1:{port}"
        args = [
            f"--port={port}",
            f"--executor-id={name}",
            f"--model={tiny_model}",
            f"--memory-manager={memory_manager}",
            f"--redis-url={redis_url}",
            f"--redis-prefix={PREFIX}",
            f"--num-kv-blocks={NUM_KV_BLOCKS}",
            *extra_args,
        ]
        self.service = ServiceProcess("services.executor", args, port, log_path)
        self.service.start(timeout_s=60)
        assert self.service.proc is not None
        self.proc = self.service.proc

    def record(self, client: redis.Redis) -> ExecutorRecord | None:
        data = client.get(executor_key(PREFIX, self.executor_id))
        return None if data is None else ExecutorRecord.decode(data)

    def wait_record(self, client: redis.Redis) -> ExecutorRecord:
        wait_for(lambda: self.record(client) is not None, 5, f"{self.executor_id}'s record")
        record = self.record(client)
        assert record is not None
        return record

    def log(self) -> str:
        return self.service.log_tail()


@pytest.fixture
def executor_factory(
    tiny_model: Path, memory_manager: ServiceProcess, shared_redis: RedisServer, tmp_path: Path
) -> Iterator[Callable[..., Executor]]:
    started: list[Executor] = []

    def start(name: str, *extra_args: str) -> Executor:
        log_path = tmp_path / f"{name}.log"
        executor = Executor(
            tiny_model, memory_manager.target, shared_redis.url, log_path, name, extra_args
        )
        started.append(executor)
        return executor

    yield start
    for executor in started:
        executor.service.stop()


def manager_stats(memory_manager: str, executor_id: str) -> memory_manager_pb2.PoolStats | None:
    with grpc.insecure_channel(memory_manager) as channel:
        stub = memory_manager_pb2_grpc.MemoryManagerStub(channel)
        try:
            return stub.GetStats(memory_manager_pb2.GetStatsRequest(executor_id=executor_id))
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            return None


def test_liveness_record_then_expiry_after_sigkill(
    executor_factory: Callable[..., Executor],
    redis_client: redis.Redis,
    memory_manager: ServiceProcess,
) -> None:
    executor = executor_factory("exec-kill")
    record = executor.wait_record(redis_client)
    assert record.executor_id == "exec-kill"
    assert record.address == executor.address
    assert record.model == "quire-tiny"
    # It describes how it hashes KV blocks, for the router to hash prompts the same way.
    assert (record.block_size, record.hash_extra_key) == (16, "quire-tiny")
    assert record.epoch > 0
    assert (record.load.kv_blocks_total, record.load.kv_blocks_used) == (NUM_KV_BLOCKS, 0)
    assert (record.load.num_running, record.load.num_waiting, record.draining) == (0, 0, False)
    assert abs(record.updated_at - time.time()) < 5
    ttl_ms = redis_client.pttl(executor_key(PREFIX, "exec-kill"))
    assert 0 < ttl_ms <= LIVENESS_TTL_S * 1000
    assert redis_client.sismember(executors_key(PREFIX), "exec-kill")
    stats = manager_stats(memory_manager.target, "exec-kill")
    assert stats is not None and stats.num_blocks_total == NUM_KV_BLOCKS

    executor.proc.send_signal(signal.SIGKILL)
    executor.proc.wait(10)
    # Nothing refreshes the record any more: it has at most LIVENESS_TTL_S left.
    assert redis_client.pttl(executor_key(PREFIX, "exec-kill")) <= LIVENESS_TTL_S * 1000
    # ... and Redis drops it then (the deadline only bounds the wait; the TTL is checked above).
    wait_for(lambda: executor.record(redis_client) is None, LIVENESS_TTL_S + 5, "record expiry")


async def _stream_through_sigterm(
    executor: Executor, client: redis.Redis, max_tokens: int
) -> dict[str, object]:
    """Start a stream, SIGTERM the executor, probe it while it drains, read to the end."""
    seen: dict[str, object] = {}
    async with grpc.aio.insecure_channel(executor.address) as channel:
        stub = executor_pb2_grpc.ExecutorStub(channel)
        call = stub.Generate(
            pb.GenerateRequest(
                request_id="long",
                prompt_token_ids=[1, 412, 87, 1024, 9],
                params=pb.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
            )
        )
        messages = [await call.read()]
        executor.proc.send_signal(signal.SIGTERM)

        health = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="quire.v1.Executor")
        deadline = time.monotonic() + 5
        while (await health.Check(request)).status != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline, "health never went NOT_SERVING"
            await asyncio.sleep(0.02)
        wait_for(lambda: getattr(executor.record(client), "draining", False), 3, "draining")
        seen["record_draining"] = True
        try:
            await stub.Generate(pb.GenerateRequest(request_id="late", prompt_token_ids=[1])).read()
        except grpc.aio.AioRpcError as exc:
            seen["late"] = (exc.code(), exc.details())
        status = await stub.GetStatus(pb.GetStatusRequest())
        seen["status_draining"] = status.draining
        seen["running_while_draining"] = status.load.num_running

        while (message := await call.read()) is not grpc.aio.EOF:
            messages.append(message)
        seen["messages"] = messages
    return seen


def test_sigterm_lets_the_running_stream_finish_then_exits_0(
    executor_factory: Callable[..., Executor],
    redis_client: redis.Redis,
    memory_manager: ServiceProcess,
) -> None:
    executor = executor_factory("exec-drain")
    executor.wait_record(redis_client)
    max_tokens = 600
    seen = asyncio.run(_stream_through_sigterm(executor, redis_client, max_tokens))

    assert seen["late"] == (grpc.StatusCode.UNAVAILABLE, "draining")
    assert seen["status_draining"] is True
    assert seen["record_draining"] is True
    assert seen["running_while_draining"] == 1, "the stream ended before the drain was probed"
    messages = seen["messages"]
    assert isinstance(messages, list)
    assert messages[-1].finished
    assert sum(len(m.outputs[0].token_ids) for m in messages if m.outputs) == max_tokens
    assert messages[-1].outputs[0].finish_reason == "length"

    assert executor.proc.wait(30) == 0, executor.log()
    assert executor.record(redis_client) is None
    assert not redis_client.sismember(executors_key(PREFIX), "exec-drain")
    assert manager_stats(memory_manager.target, "exec-drain") is None, "still registered"
    assert '"draining"' in executor.log()


def test_stale_epoch_fails_requests_and_exits_1(
    executor_factory: Callable[..., Executor],
    redis_client: redis.Redis,
    memory_manager: ServiceProcess,
) -> None:
    executor = executor_factory("exec-stale")
    record = executor.wait_record(redis_client)
    # A newer incarnation registers under the same id: the running one is now stale.
    with grpc.insecure_channel(memory_manager.target) as channel:
        memory_manager_pb2_grpc.MemoryManagerStub(channel).Register(
            memory_manager_pb2.RegisterRequest(
                executor_id="exec-stale",
                epoch=(record.epoch + 1) % 2**63,
                num_blocks=NUM_KV_BLOCKS,
                block_size=16,
                enable_prefix_caching=True,
                address="127.0.0.1:1",
            )
        )
    with grpc.insecure_channel(executor.address) as channel:
        stub = executor_pb2_grpc.ExecutorStub(channel)
        request = pb.GenerateRequest(request_id="r", prompt_token_ids=[1, 2, 3])
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Generate(request))
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert executor.proc.wait(30) == 1, executor.log()
    assert "stale epoch" in executor.log()


def test_drain_hands_back_what_outlives_its_grace_period_then_exits_0(
    executor_factory: Callable[..., Executor],
    redis_client: redis.Redis,
    memory_manager: ServiceProcess,
) -> None:
    executor = executor_factory("exec-handoff", "--drain-timeout-s=0.5")
    executor.wait_record(redis_client)

    async def stream_through_sigterm() -> tuple[int, grpc.StatusCode, str]:
        async with grpc.aio.insecure_channel(executor.address) as channel:
            call = executor_pb2_grpc.ExecutorStub(channel).Generate(
                pb.GenerateRequest(
                    request_id="long",
                    prompt_token_ids=[1, 412, 87, 1024, 9],
                    params=pb.SamplingParams(temperature=0.0, max_tokens=2000, ignore_eos=True),
                )
            )
            await call.read()
            executor.proc.send_signal(signal.SIGTERM)
            num_messages = 1
            with pytest.raises(grpc.aio.AioRpcError) as info:
                while await call.read() is not grpc.aio.EOF:
                    num_messages += 1
            return num_messages, info.value.code(), info.value.details() or ""

    num_messages, code, details = asyncio.run(stream_through_sigterm())
    # It kept generating through the grace period, then ended the stream for a migration.
    assert num_messages > 1
    assert (code, details) == (grpc.StatusCode.UNAVAILABLE, HANDED_OFF)
    assert executor.proc.wait(30) == 0, executor.log()
    assert executor.record(redis_client) is None
    assert manager_stats(memory_manager.target, "exec-handoff") is None, "still registered"
    assert "handed back" in executor.log()


def test_the_step_counter_advances_while_the_executor_works(
    executor_factory: Callable[..., Executor], redis_client: redis.Redis
) -> None:
    executor = executor_factory("exec-steps")
    before = executor.wait_record(redis_client).load.num_steps
    with grpc.insecure_channel(executor.address) as channel:
        request = pb.GenerateRequest(
            request_id="r",
            prompt_token_ids=[1, 2, 3],
            params=pb.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
        )
        list(executor_pb2_grpc.ExecutorStub(channel).Generate(request))
    # Prefill, then one decode step per further token: at least 8 steps, as Redis tells it.
    wait_for(
        lambda: getattr(executor.record(redis_client), "load", before).num_steps >= before + 8,
        3,
        "the step counter",
    )
    record = executor.record(redis_client)
    assert record is not None and not record.waiting_for_memory_manager
