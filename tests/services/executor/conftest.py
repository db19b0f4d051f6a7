"""Executor test fixtures: an in-process executor on its own event loop thread, and a
redis-server + memory manager shared by a module (killed at teardown)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.executor.executor_server import ExecutorServer
from services.executor.executor_settings import ExecutorSettings
from services.stack.ports import free_port
from tests.checkpoints import tiny_checkpoint
from tests.services.conftest import LoopThread, RedisServer, ServiceProcess

NUM_KV_BLOCKS = 64  # 1,024 token slots: small enough to reject a long prompt


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return tiny_checkpoint()


@pytest.fixture(scope="module")
def aio() -> Iterator[LoopThread]:
    with LoopThread() as loop:
        yield loop


@pytest.fixture(scope="module")
def local_executor(aio: LoopThread, tiny_model: Path) -> Iterator[ExecutorServer]:
    """An executor with an in-process BlockManager and no Redis, on a free port."""
    settings = ExecutorSettings(
        host="127.0.0.1",
        port=0,
        model=str(tiny_model),
        memory_manager="local",
        redis_url="",
        num_kv_blocks=NUM_KV_BLOCKS,
        executor_id="test-executor",
    )
    server = ExecutorServer(settings)
    assert aio.run(server.start())
    yield server
    aio.run(server.close())


# --- real processes, from tests/services/conftest.py's helpers, shared by a module -----------


@pytest.fixture(scope="module")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the module (the shared `redis_server` fixture is per test)."""
    with RedisServer(log_dir=tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def memory_manager(
    shared_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """A real `python -m services.memory_manager` process, SERVING."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("mm") / "memory_manager.log"
    args = ["--port", str(port), "--redis-url", shared_redis.url]
    service = ServiceProcess("services.memory_manager", args, port, log_path)
    service.start()
    yield service
    service.stop()
