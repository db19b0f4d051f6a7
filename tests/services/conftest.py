"""Shared fixtures for service tests: a real redis-server and service subprocesses.

- `RedisServer` / the `redis_server` fixture: a throwaway `redis-server` on a free
  port (no persistence), with `stop()` / `start()` to simulate outages on the same
  port; `redis_url` is the URL alone.
- `ServiceProcess` / the `start_service` fixture: `python -m <module> ...` from the
  repo root, logs to a file, started when its gRPC health check says SERVING;
  every process a test starts is killed at teardown.

Import the classes with `from tests.services.conftest import RedisServer, ...`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis.backoff import NoBackoff
from redis.retry import Retry

from services.stack.ports import free_port
from services.stack.runner import terminate

REPO_ROOT = Path(__file__).resolve().parents[2]

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "", poll_s: float = 0.02
) -> None:
    """Poll `predicate` every `poll_s` until it holds; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or predicate}")
        time.sleep(poll_s)


class LoopThread:
    """An asyncio event loop on a daemon thread; `run` executes a coroutine there and waits.

    In-process servers and their clients share this one loop, as grpc.aio expects.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        """Cancel what still runs on the loop (servers' leftover tasks), then stop and close
        it."""
        self.run(_cancel_other_tasks())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _cancel_other_tasks() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class RedisServer:
    """A `redis-server` child on `port` (a free one by default), no persistence."""

    def __init__(self, port: int | None = None, log_dir: Path | None = None) -> None:
        self.port = port or free_port()
        self.log_path = (log_dir or Path("/tmp")) / f"redis-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A synchronous client (bytes in, bytes out) that fails at once when Redis is down."""
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=2, retry=Retry(NoBackoff(), 0)
        )

    def start(self, timeout_s: float = 10.0) -> None:
        """Start (or restart, same port, empty) and wait until it answers PING."""
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(binary):
            pytest.fail("redis-server not found: install it (make redis)")
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--logfile", str(self.log_path)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)
        client.close()

    def stop(self) -> None:
        """Terminate it (kill after 5 s); a no-op when not running."""
        if self.proc is None:
            return
        terminate(self.proc, timeout_s=5)
        self.proc = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server for this test, stopped at teardown."""
    with RedisServer(log_dir=tmp_path) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of a fresh redis-server for this test (redis://127.0.0.1:PORT/0)."""
    return redis_server.url


def grpc_health_status(target: str, service: str = "", timeout_s: float = 1.0) -> int | None:
    """The gRPC health status of `service` at `target`; None if unreachable."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError:
            return None
        return int(response.status)


class ServiceProcess:
    """`python -m module *args` run from the repo root, output in `log_path`."""

    def __init__(
        self,
        module: str,
        args: list[str],
        grpc_port: int,
        log_path: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.module = module
        self.args = args
        self.grpc_port = grpc_port
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout_s: float = 30.0, health_service: str = "") -> None:
        """Start it and wait until its gRPC health check reports SERVING."""
        env = {**os.environ, **(self.env or {})}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        serving = health_pb2.HealthCheckResponse.SERVING
        while grpc_health_status(self.target, health_service, timeout_s=0.5) != serving:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.module} did not become SERVING:\n{self.log_tail()}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL it (a crash) and reap it."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; a no-op when not running."""
        if self.proc is not None:
            terminate(self.proc, timeout_s=5)
            self.proc = None

    def log_tail(self, num_chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-num_chars:]


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    """`start_service(module, args, grpc_port, env=None)` -> a SERVING `ServiceProcess`.

    All processes started through it are stopped at teardown.
    """
    started: list[ServiceProcess] = []

    def start(
        module: str,
        args: list[str],
        grpc_port: int,
        env: dict[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> ServiceProcess:
        log_path = tmp_path / f"{module.rsplit('.', 1)[-1]}-{grpc_port}-{len(started)}.log"
        service = ServiceProcess(module, args, grpc_port, log_path, env)
        started.append(service)
        service.start(timeout_s)
        return service

    yield start
    for service in started:
        service.stop()
