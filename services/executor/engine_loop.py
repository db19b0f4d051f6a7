"""The engine step loop: one dedicated thread owns the (synchronous, not thread-safe) engine.

Every other thread talks to it through a command list guarded by a condition variable:
`add`, `abort`, `fresh_load` and `abort_all` return a `concurrent.futures.Future` that the
loop thread resolves. Before each step the loop runs every pending command; when there is
neither work nor a command it sleeps on the condition (no busy spin), waking every
`idle_load_interval_s` to take the load again: an idle executor's pool still changes (a peer
that pulled its blocks releases their pins, a pin's lease runs out), and its liveness record
carries the last load taken. Each request has a
sink, a callable the loop thread hands every `RequestDelta` of that request (and finally
`ABORTED` or an `EngineFailure`); sinks must be cheap and thread-safe. Metrics come from each
step's `StepStats` and deltas, never from the engine's queues.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import structlog
import torch

from quire.cluster.redis_keys import ExecutorLoad
from quire.engine.inputs import Continuation
from quire.engine.llm_engine import LLMEngine
from quire.engine.stats import StepStats
from quire.outputs import RequestDelta
from quire.sampling_params import SamplingParams
from services.executor.call_futures import resolve
from services.executor.core_share import CoreShare
from services.executor.executor_logging import RequestIds
from services.executor.executor_metrics import ExecutorMetrics
from services.executor.peer_reads import PeerReads
from services.executor.remote_allocator import RemoteBlockAllocator

log = structlog.get_logger("quire.executor.engine_loop")

T = TypeVar("T")


class Aborted:
    """The request was aborted (Abort RPC, drain timeout, shutdown) before it finished."""


ABORTED = Aborted()


@dataclass(frozen=True)
class EngineFailure:
    """The engine step raised; the request was dropped."""

    message: str


SinkEvent: TypeAlias = RequestDelta | Aborted | EngineFailure
Sink = Callable[[SinkEvent], None]


class DuplicateRequestError(Exception):
    """A request with this id is already running on this executor."""


@dataclass
class _Timing:
    arrived_at: float  # monotonic time the add was submitted
    first_token_at: float | None = None
    last_token_at: float | None = None


class EngineThread:
    """The one thread an engine is built on and steps on, running what is submitted in order.

    OpenMP (torch's intra-op threads, and Quire's C++ kernels) keeps a pool of worker threads
    for each thread that starts parallel work, for that thread's life. With two such pools
    alive on a machine with few cores, libgomp stops letting its workers wait busily between
    parallel regions: each region of a decode step then waits for a worker to wake from the
    kernel (docs/benchmarks.md, "Interleaved blocks and one engine thread"). So the executor
    builds its engine (whose loading and tuning run parallel work) on the thread that will
    step it, and no other thread of the process runs torch's parallel work.
    """

    def __init__(self, name: str = "engine-loop") -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the thread after what was submitted before; its result in a Future.
        RuntimeError once closed (nothing would run it)."""
        if self._closed:
            raise RuntimeError("the engine thread is closed")
        future: Future[T] = Future()
        self._queue.put((fn, future))
        return future

    def close(self, timeout: float | None = None) -> None:
        """Let the thread finish what was submitted, then end; wait up to `timeout`."""
        self._closed = True
        self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            resolve(*item)


class EngineLoop:
    """Runs `engine.step()` on its engine thread while there is work."""

    def __init__(
        self,
        engine: LLMEngine,
        metrics: ExecutorMetrics | None = None,
        load_interval_s: float = 0.1,
        idle_load_interval_s: float = 1.0,
        on_step_error: Callable[[Exception], None] | None = None,
        request_ids: RequestIds | None = None,
        cores: CoreShare | None = None,
        threads: int | None = None,
        thread: EngineThread | None = None,
        reads: PeerReads | None = None,
    ) -> None:
        """`on_step_error` is called on the loop thread after a failed step has dropped
        every request (the server decides whether the error is fatal). `request_ids` maps
        engine request ids to the callers' request ids for the memory manager's logs.
        `cores`: the machine's cores shared with sibling executors (each step's threads follow
        who has work); None: every step runs on `threads` torch threads (None: as they are).
        The count is set on the loop thread before every step: set only once (at start-up, on
        the process's main thread or on this one) a lone two-thread executor's steps ran on
        about one core (docs/benchmarks.md, "One executor with every core"). `reads`: peers'
        block reads, run before every step (and by a pull waiting inside one: peer_reads)."""
        self.cores = cores
        self.threads = threads
        self.engine = engine
        self.metrics = metrics
        self.request_ids = request_ids or RequestIds()
        self.on_step_error = on_step_error
        self.load_interval_s = load_interval_s
        self.idle_load_interval_s = idle_load_interval_s
        self.load = ExecutorLoad()  # the latest load record; replaced, never mutated
        self._cond = threading.Condition()
        self._commands: list[Callable[[], None]] = []
        self._stopping = False
        self.reads = reads if reads is not None else PeerReads()
        self.reads.wake = self._wake
        # the thread the engine was built on (EngineThread), else one of the loop's own
        self._thread = thread if thread is not None else EngineThread()
        # Owned by the loop thread only:
        self._sinks: dict[str, Sink] = {}
        self._timings: dict[str, _Timing] = {}
        self._load_at = 0.0
        self._num_steps = 0  # steps finished (failed ones included): the load's step counter

    # --- any thread ------------------------------------------------------------------------

    def start(self) -> None:
        self._refresh_load()
        self._thread.submit(self._run)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the loop thread before the next step; its result or error in a Future."""
        future: Future[T] = Future()
        with self._cond:
            if self._stopping:
                raise RuntimeError("the engine loop is stopped")
            self._commands.append(lambda: resolve(fn, future))
            self._cond.notify()
        return future

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def add(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        sink: Sink,
        trace_id: str | None = None,
        continuation: Continuation | None = None,
    ) -> Future[None]:
        """Queue a request (or, with `continuation`, one output resumed from its first
        tokens). The Future raises ValueError (invalid, nothing queued) or
        DuplicateRequestError. `trace_id` is the caller's request id (x-request-id)."""
        arrived_at = time.monotonic()
        return self.submit(
            lambda: self._add(
                request_id, prompt_token_ids, params, sink, arrived_at, trace_id, continuation
            )
        )

    def abort(self, request_id: str, indices: tuple[int, ...] = ()) -> Future[bool]:
        """Abort a request; its sink gets ABORTED. The Future says whether it was running.

        With `indices`, end only those outputs (a stop string the router matched): their
        last deltas, and the request's if that finishes it, reach the sink as usual.
        """
        if indices:
            return self.submit(lambda: self.engine.finish_sequences(request_id, indices, "abort"))
        return self.submit(lambda: self._abort(request_id))

    def abort_all(self) -> Future[int]:
        """Abort every request; the Future gives how many there were."""
        return self.submit(lambda: sum(self._abort(rid) for rid in list(self._sinks)))

    def fresh_load(self) -> Future[ExecutorLoad]:
        """The load taken between steps, now (costs one allocator stats call)."""
        return self.submit(self._refresh_load)

    def stop(self, timeout: float | None = None) -> None:
        """Abort whatever still runs, stop the thread and wait for it."""
        self.reads.close()  # those already queued still run before the loop ends
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.close(timeout)

    # --- loop thread -----------------------------------------------------------------------

    def _has_work(self) -> bool:
        return self.engine.has_unfinished_requests()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self.cores is not None and not self._has_work():
                    self.cores.idle()  # the siblings may take this executor's cores
                while (
                    not self._commands
                    and not self._stopping
                    and not self.reads.has_pending()
                    and not self._has_work()
                ):
                    stale_in = self._load_at + self.idle_load_interval_s - time.monotonic()
                    if stale_in <= 0:
                        break
                    self._cond.wait(stale_in)
                commands, self._commands = self._commands, []
                stopping = self._stopping
            for command in commands:
                command()
            self.reads.run_pending()
            if stopping:
                for request_id in list(self._sinks):
                    self._abort(request_id)
                self._refresh_load()
                if self.cores is not None:
                    self.cores.close()  # idle, and the mapping released
                return
            if self._has_work():
                self._step()
            now = time.monotonic()
            if not self._has_work() or now - self._load_at >= self.load_interval_s:
                self._refresh_load()

    def _add(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        sink: Sink,
        arrived_at: float,
        trace_id: str | None = None,
        continuation: Continuation | None = None,
    ) -> None:
        if request_id in self._sinks:
            raise DuplicateRequestError(f"request_id {request_id!r} is already running")
        prompt = {"prompt_token_ids": prompt_token_ids}
        self.engine.add_request(request_id, prompt, params, continuation)
        self._sinks[request_id] = sink
        self._timings[request_id] = _Timing(arrived_at)
        self.request_ids.bind(request_id, trace_id or request_id)
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(len(prompt_token_ids))

    def _abort(self, request_id: str) -> bool:
        found = self.engine.abort_request(request_id)
        sink = self._sinks.pop(request_id, None)
        self._forget(request_id)
        if sink is not None:
            sink(ABORTED)
        return found

    def _forget(self, request_id: str) -> None:
        self._timings.pop(request_id, None)
        self.request_ids.release(request_id)

    def _step(self) -> None:
        if self.cores is not None:
            self.cores.before_step()
        elif self.threads:
            torch.set_num_threads(self.threads)
        try:
            result = self.engine.step()
        except Exception as exc:
            log.exception("engine step failed; dropping every request")
            self._fail_all(f"engine step failed: {exc}")
            if self.on_step_error is not None:
                self.on_step_error(exc)
            return
        finally:
            self._num_steps += 1
            self.request_ids.step_done()
        now = time.monotonic()
        self._observe_step(result.stats, now)
        for delta in result.outputs:
            self._observe(delta, now)
            sink = self._sinks.get(delta.request_id)
            if delta.finished:
                self._sinks.pop(delta.request_id, None)
                self.request_ids.release(delta.request_id)
            if sink is not None:
                sink(delta)

    def _observe_step(self, stats: StepStats, now: float) -> None:
        """Queue time of the requests this step admitted for the first time."""
        if self.metrics is None:
            return
        started = now - stats.total_s
        for request_id in stats.first_scheduled:
            timing = self._timings.get(request_id)
            if timing is not None:
                self.metrics.request_queue_time.observe(max(0.0, started - timing.arrived_at))
        self.metrics.observe_step(stats)

    def _observe(self, delta: RequestDelta, now: float) -> None:
        timing = self._timings.get(delta.request_id)
        if timing is None:
            return
        if any(o.new_token_ids for o in delta.outputs):
            if timing.first_token_at is None:
                timing.first_token_at = now
                if self.metrics is not None:
                    self.metrics.time_to_first_token.observe(now - timing.arrived_at)
            elif timing.last_token_at is not None and self.metrics is not None:
                self.metrics.inter_token_latency.observe(now - timing.last_token_at)
            timing.last_token_at = now
        if delta.finished:
            del self._timings[delta.request_id]
            if self.metrics is not None:
                self.metrics.e2e_request_latency.observe(now - timing.arrived_at)

    def _fail_all(self, message: str) -> None:
        for request_id in list(self._sinks):
            try:
                self.engine.abort_request(request_id)
            except Exception:
                log.exception("abort after a failed step also failed", request_id=request_id)
            self._forget(request_id)
            self._sinks.pop(request_id)(EngineFailure(message))

    def _refresh_load(self) -> ExecutorLoad:
        """Build the one load record from the engine's counters (the only place it is built)."""
        self._load_at = time.monotonic()
        try:
            stats = self.engine.stats()
        except Exception as exc:
            log.warning("engine stats failed", error=str(exc))
            return self.load
        pool = stats.allocator
        self.load = ExecutorLoad(
            num_running=stats.num_running,
            num_waiting=stats.num_waiting,
            kv_blocks_total=pool.num_blocks_total,
            kv_blocks_used=pool.num_blocks_used,
            kv_blocks_cached=pool.num_blocks_cached,
            num_steps=self._num_steps,
        )
        if self.metrics is not None:
            self.metrics.observe_load(self.load)
            self.metrics.observe_prefix_cache(pool.prefix_cache_queries, pool.prefix_cache_hits)
            allocator = self.engine.allocator
            if isinstance(allocator, RemoteBlockAllocator):
                self.metrics.observe_allocator_steps(allocator.num_steps, allocator.num_quiet_steps)
        return self.load
