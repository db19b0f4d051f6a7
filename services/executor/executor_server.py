"""One executor process: engine + step loop + gRPC server + health + liveness + metrics.

Lifecycle: `start()` binds the port, loads the model, registers with the memory manager
and starts serving; `drain()` refuses new work, waits for what runs and hands the rest back
to the routers; `close()` stops the server and the loop, deregisters and deletes the
liveness record.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import asdict, fields
from typing import Any

import grpc
import structlog
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from quire.cache.paged_kv import kv_bytes_per_token
from quire.cluster.redis_keys import ExecutorRecord
from quire.config import EngineConfig
from quire.engine.llm_engine import LLMEngine
from quire.model.linear import TUNE_CONDITIONS, TUNINGS
from services.common import keepalive, tls
from services.common.epochs import StaleEpochError
from services.executor import allocator_factory as alloc
from services.executor.core_share import CoreShare
from services.executor.engine_loop import EngineLoop, EngineThread
from services.executor.executor_logging import RequestIds, bind_global
from services.executor.executor_metrics import ExecutorMetrics
from services.executor.executor_servicer import ExecutorIdentity, ExecutorServicer
from services.executor.executor_settings import ExecutorSettings
from services.executor.liveness import LivenessPublisher
from services.executor.peer_reads import PeerReads
from services.rpc import executor_pb2, executor_pb2_grpc

log = structlog.get_logger("quire.executor")

SERVICE_NAME = executor_pb2.DESCRIPTOR.services_by_name["Executor"].full_name
_HAND_OFF_GRACE_S = 10.0  # after handing leftovers back, how long streams get to close


def new_epoch() -> int:
    """A fresh 63-bit incarnation number (fits int64 and uint64 alike) that grows over time.

    The memory manager refuses an epoch older than the one it holds, so a process that
    restarts under the same id (after a crash, without deregistering) must get a larger
    one: wall-clock microseconds, with 10 random low bits against same-microsecond starts.
    """
    return (time.time_ns() // 1000) << 10 | secrets.randbits(10)


class ExecutorServer:
    """Owns every piece of one executor; see the module docstring for the lifecycle."""

    def __init__(self, settings: ExecutorSettings) -> None:
        self.settings = settings
        self.epoch = new_epoch()
        self.server: Any = None  # grpc.aio.Server, created on the serving event loop
        self.health = health.aio.HealthServicer()
        self.port = 0
        self.identity: ExecutorIdentity | None = None
        self.engine: LLMEngine | None = None
        self.loop: EngineLoop | None = None
        # peers' block reads; the engine's pulls and its loop both run them (peer_reads)
        self.reads = PeerReads()
        self.servicer: ExecutorServicer | None = None
        self.liveness: LivenessPublisher | None = None
        self.metrics: ExecutorMetrics | None = None
        self.request_ids = RequestIds()  # engine thread only: request ids for Step metadata
        self._metrics_server: Any = None
        self.stopping = False  # a stop was requested: start-up gives up, serving drains
        self.exit_code = 0
        self.stale = False  # another incarnation took over our id at the memory manager
        self._stop_requested = asyncio.Event()  # binds to the serving loop on first wait

    async def start(self) -> bool:
        """Bring the executor up; False if `stopping` was set before it could serve."""
        s = self.settings
        event_loop = asyncio.get_running_loop()
        self.server = grpc.aio.server(options=keepalive.server_options())
        self.port = tls.add_port(self.server, f"{s.host}:{s.port}", s.tls_cert, s.tls_key)
        if self.port == 0:
            raise OSError(f"cannot bind {s.host}:{s.port}")
        identity = ExecutorIdentity(
            executor_id=s.resolved_executor_id(self.port),
            epoch=self.epoch,
            model=s.resolved_model_name(),
            address=s.resolved_advertise_address(self.port),
        )
        self.identity = identity
        bind_global(executor_id=identity.executor_id)
        if s.torch_threads:
            torch.set_num_threads(s.torch_threads)
        log.info(
            "loading model",
            model=s.model,
            epoch=identity.epoch,
            port=self.port,
            torch_threads=torch.get_num_threads(),
        )
        self.metrics = ExecutorMetrics(identity.model)
        # Built on the thread that will step it (EngineThread says why).
        engine_thread = EngineThread()
        try:
            engine = await asyncio.wrap_future(
                engine_thread.submit(lambda: self._build_engine(identity))
            )
            self.engine = engine
            if self.stopping or not await alloc.register(engine.allocator, lambda: self.stopping):
                engine_thread.close()
                return False
        except BaseException:
            engine_thread.close()
            raise

        def on_step_error(exc: Exception) -> None:  # on the engine thread
            event_loop.call_soon_threadsafe(self._on_step_error, exc)

        cores = None
        if s.share_cores_file:
            cores = CoreShare(
                s.share_cores_file,
                s.share_cores_slot,
                s.share_cores_total,
                floor=max(1, s.torch_threads),
            )
            log.info(
                "sharing cores",
                file=s.share_cores_file,
                slot=s.share_cores_slot,
                cores=cores.cores,
                floor=cores.floor,
            )
        self.loop = EngineLoop(
            engine,
            self.metrics,
            on_step_error=on_step_error,
            request_ids=self.request_ids,
            cores=cores,
            threads=s.torch_threads or None,
            thread=engine_thread,
            reads=self.reads,
        )
        self.loop.start()
        self.servicer = ExecutorServicer(
            self.loop, identity, log_prompts=s.log_prompts, role=s.role
        )
        executor_pb2_grpc.add_ExecutorServicer_to_server(self.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        await self.server.start()
        if s.redis_url:
            self.liveness = LivenessPublisher(s.redis_url, s.redis_prefix, self.record)
            self.liveness.start()
        if s.metrics_port:
            self._metrics_server = self.metrics.serve(s.host, s.metrics_port)
        log.info(
            "executor serving",
            address=identity.address,
            port=self.port,
            metrics_port=s.metrics_port or None,
            model=identity.model,
            num_kv_blocks=engine.allocator.num_blocks,
            kv_groups=engine.runner.groups.num_groups,
            kv_bytes_per_token=kv_bytes_per_token(engine.model.config, engine.kv_dtype),
            dtype=str(engine.dtype).removeprefix("torch."),
            kv_cache_dtype=str(engine.kv_dtype).removeprefix("torch."),
            linear_backend=getattr(engine.model, "linear_backend", None),
            linear_tuning=[
                {
                    "dtype": str(key[0]).removeprefix("torch."),
                    "slowdown": {b: round(r, 3) for b, r in times.items()},
                    **asdict(TUNE_CONDITIONS[key]),
                }
                for key, times in TUNINGS.items()
            ],
            torch_threads=torch.get_num_threads(),
            memory_manager=s.memory_manager,
            tls=bool(s.tls_cert),
        )
        return True

    def _build_engine(self, identity: ExecutorIdentity) -> LLMEngine:
        s = self.settings
        # ExecutorSettings carries every EngineConfig field under the same name.
        config = EngineConfig(**{f.name: getattr(s, f.name) for f in fields(EngineConfig)})
        factory = alloc.allocator_factory(
            s,
            identity.executor_id,
            identity.epoch,
            identity.address,
            step_metadata=self.request_ids.step_metadata,
        )
        return LLMEngine(
            config, allocator_factory=factory, puller_factory=alloc.puller_factory(s, self.reads)
        )

    def request_stop(self, exit_code: int = 0) -> None:
        """Ask `wait_stop_requested()` to return (signal handler, fatal engine error)."""
        self.stopping = True
        self.exit_code = max(self.exit_code, exit_code)
        self._stop_requested.set()

    async def wait_stop_requested(self) -> None:
        await self._stop_requested.wait()

    def _on_step_error(self, exc: Exception) -> None:
        if isinstance(exc, StaleEpochError):
            # A newer process registered under our id: this one must not serve any more.
            log.error("stale epoch: another executor took this id; exiting", error=str(exc))
            self.stale = True
            if self.liveness is not None:
                self.liveness.stop()  # the record is the successor's now
            self.request_stop(exit_code=1)

    def record(self) -> ExecutorRecord:
        """This executor's liveness record: its latest load and how it hashes blocks."""
        assert self.identity is not None and self.loop is not None, "not started"
        assert self.engine is not None, "not started"
        return ExecutorRecord(
            executor_id=self.identity.executor_id,
            address=self.identity.address,
            epoch=self.identity.epoch,
            model=self.identity.model,
            load=self.loop.load,
            block_size=self.engine.config.block_size,
            hash_extra_key=self.engine.scheduler.config.extra_key,
            draining=self.servicer is not None and self.servicer.draining,
            role=self.settings.role,
            pull_cost_fraction=self.engine.scheduler.pull_costs.cost_fraction,
            waiting_for_memory_manager=alloc.is_recovering(self.engine.allocator),
            layers_run=getattr(self.engine.model, "layers_run", 0),
        )

    async def _set_health(self, status: Any) -> None:
        await self.health.set("", status)
        await self.health.set(SERVICE_NAME, status)

    async def drain(self, timeout_s: float | None = None) -> None:
        """Take no new requests, announce it, wait for running ones; when the grace period
        (`--drain-timeout-s`) runs out, hand what is left back to the routers."""
        if self.servicer is None or self.loop is None:
            return
        if not self.servicer.draining:
            self.servicer.draining = True
            await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            if self.liveness is not None:
                self.liveness.publish_soon()
            log.info("draining", num_streams=self.servicer.num_active_streams)
        timeout = self.settings.drain_timeout_s if timeout_s is None else timeout_s
        try:
            await asyncio.wait_for(self.servicer.wait_streams_done(), timeout)
            return
        except TimeoutError:
            log.warning(
                "drain grace period over; handing the rest back",
                num_streams=self.servicer.num_active_streams,
            )
        await self.hand_off()

    async def hand_off(self) -> None:
        """End every open stream with UNAVAILABLE, its request aborted here: the router
        continues each one on another executor (services/router/executor_lost.py)."""
        if self.servicer is None or self.loop is None:
            return
        self.servicer.handing_off = True
        try:
            await asyncio.wrap_future(self.loop.abort_all())
        except RuntimeError:  # already stopped
            return
        try:
            await asyncio.wait_for(self.servicer.wait_streams_done(), _HAND_OFF_GRACE_S)
        except TimeoutError:
            log.warning("streams still open after handing them back")

    async def close(self) -> None:
        """Stop serving, stop the loop, deregister, delete the liveness record."""
        if self.server is not None:
            await self.server.stop(grace=1.0)
        if self.loop is not None:
            await asyncio.to_thread(self.loop.stop)
        if self.engine is not None and not self.stale:
            await alloc.release(self.engine.allocator)
        if self.liveness is not None:
            # A stale incarnation must not delete the record its successor publishes.
            await self.liveness.close(delete=not self.stale)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        log.info("executor stopped")
