"""Prometheus metrics of the memory manager, served on their own HTTP port.

Each manager owns a `CollectorRegistry` (several managers can share a process in
tests). Pool gauges are refreshed from the event loop (`update_pools`) rather than
per Step: counting cached blocks walks the hash index, which is too slow for the
Step path on large pools.

Names, types and labels: docs/metrics.md (`make docs-metrics` writes it from this registry).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from services.memory_manager.pools import ExecutorPool

# Step handling is sub-millisecond when healthy; the top buckets catch stalls.
STEP_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip


class ManagerMetrics:
    """Step latency, RPC errors and per-executor block gauges."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.step_seconds = Histogram(
            "quire_memory_manager_step_duration_seconds",
            "Time to serve one Step call (allocation + translation).",
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.rpc_errors = Counter(
            "quire_memory_manager_rpc_errors",
            "RPCs answered with an error status, by method and code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.steps = Counter(
            "quire_memory_manager_steps",
            "Step calls served, by executor.",
            ["executor"],
            registry=self.registry,
        )
        self.executors = Gauge(
            "quire_memory_manager_registered_executors",
            "Executors registered with this manager.",
            registry=self.registry,
        )
        self.blocks_total = self._pool_gauge(
            "quire_memory_manager_blocks", "KV blocks in the pool."
        )
        self.blocks_used = self._pool_gauge(
            "quire_memory_manager_blocks_used", "Blocks with refcount > 0."
        )
        self.blocks_cached = self._pool_gauge(
            "quire_memory_manager_blocks_cached", "Free blocks still findable by hash."
        )
        self.redis_healthy = Gauge(
            "quire_memory_manager_redis_healthy",
            "1 while prefix publishing to Redis succeeds (or Redis is disabled), else 0.",
            registry=self.registry,
        )
        self.redis_healthy.set(1)
        self._http: tuple[WSGIServer, threading.Thread] | None = None

    def _pool_gauge(self, name: str, description: str) -> Gauge:
        return Gauge(name, description, ["executor"], registry=self.registry)

    def update_pools(self, pools: Iterable[ExecutorPool]) -> None:
        """Set the per-executor gauges from the pools' current stats."""
        num_pools = 0
        for pool in pools:
            num_pools += 1
            stats = pool.manager.stats()
            self.blocks_total.labels(pool.executor_id).set(stats.num_blocks_total)
            self.blocks_used.labels(pool.executor_id).set(stats.num_blocks_used)
            self.blocks_cached.labels(pool.executor_id).set(stats.num_blocks_cached)
        self.executors.set(num_pools)

    def forget(self, executor_id: str) -> None:
        """Drop the gauges of an executor that left."""
        for metric in (self.blocks_total, self.blocks_used, self.blocks_cached, self.steps):
            with contextlib.suppress(KeyError):
                metric.remove(executor_id)

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics over HTTP on a daemon thread; returns the bound port."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = (server, thread)
        return int(server.server_port)

    def stop(self) -> None:
        """Stop the HTTP server, if serving."""
        if self._http is not None:
            server, thread = self._http
            server.shutdown()
            server.server_close()
            thread.join(timeout=2)
            self._http = None
