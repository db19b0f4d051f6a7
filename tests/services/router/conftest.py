"""Router test harness: fake executors and routers on one background event loop.

The fakes (grpc.aio servers) and each router (uvicorn in-process) share one asyncio loop on
a daemon thread, so tests talk to them with ordinary blocking clients (openai, httpx) from
the test thread. Executor records and prefix sets are written to a real redis-server under a
fresh key prefix per test.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest
import redis
import uvicorn
from fastapi import FastAPI

from quire.block.hashing import hash_full_blocks
from quire.cluster.redis_keys import (
    ExecutorLoad,
    ExecutorRecord,
    executor_key,
    executors_key,
    prefix_key,
)
from services.router.main import create_apps
from services.router.prompts import load_tokenizer
from services.router.router_settings import RouterSettings
from services.router.state import RouterState
from tests.services.conftest import LoopThread, RedisServer
from tests.services.router.fake_executor import FakeServer, Script, start_fake

MODEL = "models/quire-tiny"
MODEL_NAME = "quire-tiny"
EXECUTOR_IDS = ("ex-a", "ex-b", "ex-c")


@dataclass
class RouterHandle:
    """A running router: its public and admin base URLs and clients for them."""

    base_url: str  # the public app: /v1/*, /health, /tokenize
    admin_url: str  # the admin app: /metrics, /cluster/status, /dashboard, /docs, /openapi.json
    servers: list[uvicorn.Server]
    tasks: list[asyncio.Task[None]]
    settings: RouterSettings
    app: FastAPI

    @property
    def state(self) -> RouterState:
        """The router's live state (admission counters, directory) for white-box checks."""
        state: RouterState = self.app.state.router
        return state

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0)

    def http(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=kwargs.pop("timeout", 10), **kwargs)

    def admin(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.admin_url, timeout=kwargs.pop("timeout", 10), **kwargs)


async def _serve(app: FastAPI) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, task, f"http://127.0.0.1:{port}"


async def _start_router(settings: RouterSettings) -> RouterHandle:
    """Both apps on free ports, as `python -m services.router` serves them."""
    apps = create_apps(settings)
    public, public_task, public_url = await _serve(apps.public)
    admin, admin_task, admin_url = await _serve(apps.admin)
    return RouterHandle(
        public_url, admin_url, [public, admin], [public_task, admin_task], settings, apps.public
    )


async def _stop_router(handle: RouterHandle) -> None:
    for server in handle.servers:
        server.should_exit = True
    await asyncio.wait_for(asyncio.gather(*handle.tasks), 10)


@dataclass
class Cluster:
    """Fakes + Redis under a fresh prefix, and routers started for this test."""

    bg: LoopThread
    redis_server: RedisServer
    fakes: dict[str, FakeServer]
    prefix: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:8]}")
    routers: list[RouterHandle] = field(default_factory=list)

    @property
    def redis(self) -> redis.Redis:
        return self.redis_server.client()

    def publish(
        self, executor_id: str, address: str | None = None, **fields: Any
    ) -> ExecutorRecord:
        """Write (or overwrite) a live record, as an executor's heartbeat does."""
        load_fields = {
            k: fields.pop(k) for k in list(fields) if k in ExecutorLoad.__dataclass_fields__
        }
        record = ExecutorRecord(
            executor_id=executor_id,
            address=address or self.fakes[executor_id].address,
            epoch=fields.pop("epoch", 7),
            model=fields.pop("model", MODEL_NAME),
            load=ExecutorLoad(**{"kv_blocks_total": 100, **load_fields}),
            # As a real executor announces them: the router hashes prompts with these.
            block_size=fields.pop("block_size", 16),
            hash_extra_key=fields.pop("hash_extra_key", MODEL_NAME),
            **fields,
        ).stamped()
        client = self.redis
        client.set(executor_key(self.prefix, executor_id), record.encode(), px=60_000)
        client.sadd(executors_key(self.prefix), executor_id)
        return record

    def publish_all(self) -> None:
        for executor_id in self.fakes:
            self.publish(executor_id)

    def seed_prefix(self, executor_id: str, token_ids: list[int], epoch: int = 7) -> list[bytes]:
        """Mark the prompt's full blocks as cached on an executor (as a memory manager does)."""
        hashes = hash_full_blocks(token_ids, 16, MODEL_NAME)
        self.redis.sadd(prefix_key(self.prefix, executor_id, epoch), *hashes)
        return hashes

    def script(self, script: Script, *executor_ids: str) -> None:
        for executor_id in executor_ids or tuple(self.fakes):
            self.fakes[executor_id].executor.reset(script)

    def router(self, **overrides: Any) -> RouterHandle:
        values: dict[str, Any] = {
            "model": MODEL,
            "redis_url": self.redis_server.url,
            "redis_prefix": self.prefix,
            "registry_cache_s": 0.0,
        }
        values.update(overrides)
        handle = self.bg.run(_start_router(RouterSettings(**values)))
        self.routers.append(handle)
        return handle

    def stop_routers(self) -> None:
        for handle in self.routers:
            self.bg.run(_stop_router(handle))
        self.routers.clear()


@pytest.fixture(scope="session")
def bg_loop() -> Iterator[LoopThread]:
    with LoopThread() as bg:
        yield bg


@pytest.fixture(scope="session")
def fakes(bg_loop: LoopThread) -> Iterator[dict[str, FakeServer]]:
    servers = {e: bg_loop.run(start_fake(e)) for e in EXECUTOR_IDS}
    yield servers
    for fake in servers.values():
        bg_loop.run(fake.server.stop(None))


@pytest.fixture(scope="session")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(log_dir=tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return load_tokenizer(MODEL)


@pytest.fixture
def router_setup(
    bg_loop: LoopThread, fakes: dict[str, FakeServer], shared_redis: RedisServer, tokenizer: Any
) -> Iterator[tuple[Cluster, RouterHandle, Any]]:
    """Live records for the (unscripted) fakes, one router over them, and the tokenizer."""
    c = Cluster(bg_loop, shared_redis, fakes)
    c.publish_all()
    handle = c.router()
    yield c, handle, tokenizer
    bg_loop.run(_stop_router(handle))


@pytest.fixture
def cluster(
    bg_loop: LoopThread, fakes: dict[str, FakeServer], shared_redis: RedisServer, tokenizer: Any
) -> Iterator[Cluster]:
    """Three fakes with live records under a fresh prefix, playing " one two ... eight"."""
    c = Cluster(bg_loop, shared_redis, fakes)
    default = tokenizer.encode(" one two three four five six seven eight", add_special_tokens=False)
    c.script(Script(tokens=default + [2]))
    c.publish_all()
    yield c
    c.stop_routers()


@pytest.fixture(scope="module")
def module_cluster(
    bg_loop: LoopThread, fakes: dict[str, FakeServer], shared_redis: RedisServer
) -> Iterator[Cluster]:
    """Three unscripted fakes with live records under a fresh prefix, for a whole module (its
    tests send one-shot requests to routers started once)."""
    c = Cluster(bg_loop, shared_redis, fakes)
    c.publish_all()
    yield c
    c.stop_routers()
