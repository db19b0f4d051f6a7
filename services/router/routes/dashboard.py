"""The live KV-cache dashboard: GET /dashboard (one self-contained page), GET /dashboard/state,
both on the admin port (services.router.admin).

The page polls /dashboard/state about twice a second and draws every executor's KV blocks
as a grid of squares. The states are the memory manager's own (`GetBlockStates`: one byte
per block, 0 free, 1 used, 2 cached, 3 shared), read from `--memory-manager`; running and
waiting counts come from the executors' Redis records. Snapshots are shared for
`SNAPSHOT_S`, so any number of open pages costs the manager a few calls per second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel

from quire.cluster.redis_keys import ExecutorRecord
from services.common import tls
from services.router.deps import StateDep
from services.router.state import RouterState
from services.rpc import memory_manager_pb2 as pb
from services.rpc import memory_manager_pb2_grpc as pb_grpc

PAGE = Path(__file__).resolve().parents[1] / "static" / "dashboard.html"
SNAPSHOT_S = 0.2  # a snapshot younger than this is served again
RPC_TIMEOUT_S = 1.0  # per GetBlockStates call
_STATE_DIGITS = bytes.maketrans(bytes(range(4)), b"0123")
# A restarted manager shows up again within seconds (gRPC's default backoff reaches 120 s).
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class ExecutorBlocks(BaseModel):
    """One executor: its load (Redis record) and its pool (memory manager)."""

    id: str
    address: str
    healthy: bool
    num_running: int
    num_waiting: int
    error: str | None = None  # why there is no pool below (e.g. not registered there)
    epoch: int = 0
    block_size: int = 0
    num_blocks_total: int = 0
    num_blocks_used: int = 0  # refcount >= 1 (shared ones included)
    num_blocks_cached: int = 0
    num_blocks_shared: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up, since the executor registered
    prefix_cache_hits: int = 0  # of those, tokens found cached
    prefix_hit_rate: float | None = None
    states: str = ""  # one digit per block: 0 free, 1 used, 2 cached, 3 shared


class DashboardState(BaseModel):
    """What one poll of the page gets."""

    memory_manager: str
    error: str | None  # the memory manager could not be asked (no pools below)
    source: str  # where the executor list came from (see ClusterView.source)
    time: float  # unix time of the snapshot
    executors: list[ExecutorBlocks]


class BlockStateSource:
    """Reads `GetBlockStates` from one memory manager; shares a snapshot for `SNAPSHOT_S`."""

    def __init__(self, address: str, tls_ca: str = "") -> None:
        self.address = address
        self.tls_ca = tls_ca  # PEM CA bundle for a TLS memory manager ('' = plaintext)
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.MemoryManagerStub | None = None
        self._lock = asyncio.Lock()
        self._snapshot: DashboardState | None = None
        self._taken_at = 0.0

    async def snapshot(self, state: RouterState) -> DashboardState:
        async with self._lock:
            if self._snapshot is None or time.monotonic() - self._taken_at > SNAPSHOT_S:
                self._snapshot = await self._take(state)
                self._taken_at = time.monotonic()
            return self._snapshot

    async def _take(self, state: RouterState) -> DashboardState:
        view = await state.directory.view()
        down = state.directory.down_executors()
        records = sorted(view.records, key=lambda r: r.executor_id)
        executors = [_from_record(r, r.executor_id not in down) for r in records]
        error = None
        if not self.address:
            error = "no memory manager configured (--memory-manager)"
        elif records:
            replies = await asyncio.gather(
                *(self._fetch(r.executor_id) for r in records), return_exceptions=True
            )
            for out, reply in zip(executors, replies, strict=True):
                if isinstance(reply, grpc.aio.AioRpcError):
                    if reply.code() != grpc.StatusCode.NOT_FOUND:
                        error = f"memory manager {self.address}: {reply.code().name}"
                    out.error = reply.details() or reply.code().name
                elif isinstance(reply, BaseException):
                    raise reply
                else:
                    _fill(out, reply)
        return DashboardState(
            memory_manager=self.address,
            error=error,
            source=view.source,
            time=time.time(),
            executors=executors,
        )

    async def _fetch(self, executor_id: str) -> pb.BlockStates:
        if self._stub is None:
            self._channel = tls.aio_channel(self.address, self.tls_ca, _CHANNEL_OPTIONS)
            self._stub = pb_grpc.MemoryManagerStub(self._channel)
        request = pb.GetBlockStatesRequest(executor_id=executor_id)
        reply: pb.BlockStates = await self._stub.GetBlockStates(request, timeout=RPC_TIMEOUT_S)
        return reply

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)
        self._channel = self._stub = None


def _from_record(record: ExecutorRecord, healthy: bool) -> ExecutorBlocks:
    return ExecutorBlocks(
        id=record.executor_id,
        address=record.address,
        healthy=healthy and not record.draining,
        num_running=record.load.num_running,
        num_waiting=record.load.num_waiting,
        epoch=record.epoch,
    )


def _fill(out: ExecutorBlocks, reply: pb.BlockStates) -> None:
    stats = reply.stats
    out.epoch = reply.epoch
    out.block_size = reply.block_size
    out.num_blocks_total = stats.num_blocks_total
    out.num_blocks_used = stats.num_blocks_used
    out.num_blocks_cached = stats.num_blocks_cached
    out.num_blocks_shared = stats.num_blocks_shared
    out.prefix_cache_queries = stats.prefix_cache_queries
    out.prefix_cache_hits = stats.prefix_cache_hits
    if stats.prefix_cache_queries:
        out.prefix_hit_rate = stats.prefix_cache_hits / stats.prefix_cache_queries
    out.states = reply.states.translate(_STATE_DIGITS).decode("ascii")


def _source(app: FastAPI, address: str, tls_ca: str = "") -> BlockStateSource:
    # Created on first use, on the serving event loop (grpc.aio channels are bound to it).
    source: BlockStateSource | None = getattr(app.state, "block_states", None)
    if source is None:
        source = app.state.block_states = BlockStateSource(address, tls_ca)
    return source


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    source: BlockStateSource | None = getattr(app.state, "block_states", None)
    if source is not None:
        await source.close()


router = APIRouter(tags=["dashboard"], lifespan=_lifespan)


@router.get("/dashboard", response_class=HTMLResponse)
async def dashboard() -> HTMLResponse:
    """The page: no external assets, plain JavaScript polling /dashboard/state."""
    return HTMLResponse(PAGE.read_text(encoding="utf-8"))


@router.get("/dashboard/state")
async def dashboard_state(request: Request, state: StateDep) -> DashboardState:
    """Every executor's block states and counters, as the page draws them."""
    source = _source(request.app, state.settings.memory_manager, state.settings.tls_ca)
    return await source.snapshot(state)
