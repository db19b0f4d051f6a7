"""Wiring: the gRPC server (MemoryManager + health), the Redis publisher, /metrics.

`MemoryManagerServer(settings)` is what `python -m services.memory_manager` runs and
what tests start in-process: `await start()` returns the bound gRPC port (settings
may ask for port 0), `await stop()` shuts everything down.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from services.common import keepalive, tls
from services.memory_manager.manager_metrics import ManagerMetrics
from services.memory_manager.manager_servicer import MemoryManagerServicer
from services.memory_manager.manager_settings import Settings
from services.memory_manager.pools import ExecutorPools
from services.memory_manager.prefix_publisher import PrefixPublisher
from services.rpc import memory_manager_pb2, memory_manager_pb2_grpc

log = structlog.get_logger(__name__)

SERVICE_NAME = memory_manager_pb2.DESCRIPTOR.services_by_name["MemoryManager"].full_name
# how often pool gauges and the Redis health gauge are updated, and expired pins dropped (an
# idle cluster makes no Step, which would drop them otherwise)
GAUGE_REFRESH_S = 1.0


class MemoryManagerServer:
    """One memory manager: its executors' pools behind gRPC, prefixes mirrored to Redis."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pools = ExecutorPools()
        self.metrics = ManagerMetrics()
        self.publisher: PrefixPublisher | None = None
        if settings.redis_url:
            self.publisher = PrefixPublisher.from_url(
                settings.redis_url, settings.redis_prefix, refresh_s=settings.prefix_refresh_s
            )
        self.health = health_aio.HealthServicer()
        self.port = 0  # the bound gRPC port, once started
        self.metrics_port = 0  # the bound /metrics port, once started (0: disabled)
        self._server: grpc.aio.Server | None = None
        self._gauge_task: asyncio.Task[None] | None = None
        self._servicer: MemoryManagerServicer | None = None

    async def start(self) -> int:
        """Bind and start serving; returns the gRPC port."""
        server = grpc.aio.server(options=keepalive.server_options())
        address = f"{self.settings.host}:{self.settings.port}"
        self.port = tls.add_port(server, address, self.settings.tls_cert, self.settings.tls_key)
        if self.port == 0:
            raise RuntimeError(f"cannot bind {self.settings.host}:{self.settings.port}")
        manager_id = self.settings.manager_id or f"{self.settings.host}:{self.port}"
        servicer = MemoryManagerServicer(
            self.pools,
            self.publisher,
            self.metrics,
            manager_id,
            self.settings.log_prompts,
            self.settings.pull_lease_s,
        )
        self._servicer = servicer
        memory_manager_pb2_grpc.add_MemoryManagerServicer_to_server(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        if self.publisher is not None:
            self.publisher.start()
        await server.start()
        self._server = server
        if self.settings.metrics_port:
            self.metrics_port = self.metrics.serve(self.settings.host, self.settings.metrics_port)
        self._gauge_task = asyncio.get_running_loop().create_task(self._refresh_gauges())
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "memory manager serving",
            manager_id=manager_id,
            port=self.port,
            metrics_port=self.metrics_port or None,
            redis=bool(self.publisher),
            tls=bool(self.settings.tls_cert),
        )
        return self.port

    async def wait(self) -> None:
        """Block until the gRPC server terminates."""
        if self._server is not None:
            await self._server.wait_for_termination()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop taking calls, let in-flight ones finish, flush Redis briefly, close."""
        if self._server is None:
            return
        grace = self.settings.shutdown_grace_s if grace_s is None else grace_s
        await self.health.enter_graceful_shutdown()
        await self._server.stop(grace)
        self._server = None
        if self._gauge_task is not None:
            self._gauge_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gauge_task
        if self.publisher is not None:
            await self.publisher.close()
        self.metrics.stop()
        log.info("memory manager stopped", port=self.port)

    async def _refresh_gauges(self) -> None:
        while True:
            if self._servicer is not None:
                self._servicer.pulls.expire()
            self.metrics.update_pools(self.pools)
            healthy = self.publisher is None or self.publisher.is_healthy
            self.metrics.redis_healthy.set(1 if healthy else 0)
            await asyncio.sleep(GAUGE_REFRESH_S)
