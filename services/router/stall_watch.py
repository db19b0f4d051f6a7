"""Hung executors: alive by their liveness record, or silent without one, and making no progress.

A process that dies resets its connections, and its streams end with UNAVAILABLE at once. One
that stops without dying does not: a step stuck in a kernel or a lock, a SIGSTOP, a paused
container, a network cut. Its streams just go quiet. This router declares such an executor
lost (`Dispatcher.lose_executor`, which marks it down and migrates its streams; see
services/router/executor_lost.py) once, for `stall_s` seconds (`--executor-stall-s`):

1. a read of this router has waited on it all that time (a stream's next response, or a
   call's first), and
2. its own liveness record shows no progress: neither the step counter it publishes
   (`ExecutorLoad.num_steps`) nor its count of decoder layers run (`ExecutorRecord.layers_run`,
   which moves inside a step) has moved, or the record is gone from Redis (the heartbeat
   stopped: the whole process is frozen or cut off).

A stream whose client has stopped reading waits on nobody, and silence alone is not enough:
a stream queued behind other routers' requests is silent while its executor steps. A record that says `waiting_for_memory_manager` is not hung either: its
step is retrying an unreachable memory manager, which the other executors of that manager wait
for too. Without Redis (the view comes from the last records seen) nothing is judged. So
`stall_s` must exceed the longest layer of a step the deployment runs (a layer of a long
prefill chunk on a CPU), and the heartbeat's interval; detection takes between `stall_s` and
`stall_s` plus a check interval.

`StallDetector` is the rule, on an injected clock; `StallWatch` runs it every `check_s` over the
dispatcher's open streams and the directory's view.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from quire.cluster.redis_keys import ExecutorRecord
from services.router.directory import ClusterView, ExecutorDirectory

log = structlog.get_logger("router.stall_watch")


@dataclass
class _Progress:
    """What was last seen of one executor a read waits on."""

    num_steps: int | None  # its step counter at the last change (None: no record seen)
    moved_at: float  # when its counters last changed (or a read began waiting on it)
    layers_run: int | None = None  # its layer counter at the last change


class StallDetector:
    """Which executors made no progress for `stall_s`, from silence and their records."""

    def __init__(self, stall_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if stall_s <= 0:
            raise ValueError(f"stall_s must be > 0, got {stall_s}")
        self.stall_s = stall_s
        self.clock = clock
        self._progress: dict[str, _Progress] = {}

    def stalled(
        self,
        waiting_since: dict[str, float],
        view: ClusterView,
    ) -> dict[str, str]:
        """The stalled executors, each with the reason, among `waiting_since`: every executor
        a read waits on, mapped to since when its oldest pending read has waited. `view` is
        the directory's current one."""
        now = self.clock()
        # Forget executors nothing waits on: their progress restarts when something does.
        for executor_id in list(self._progress):
            if executor_id not in waiting_since:
                del self._progress[executor_id]
        if view.source != "redis":
            self._progress.clear()  # no records to judge by; start afresh when Redis is back
            return {}
        records = {r.executor_id: r for r in view.records}
        stalled: dict[str, str] = {}
        for executor_id, since in waiting_since.items():
            record = records.get(executor_id)
            progress = self._observe(executor_id, record, now)
            silent_s = now - since
            if silent_s < self.stall_s or now - progress.moved_at < self.stall_s:
                continue
            if record is None:
                stalled[executor_id] = (
                    f"no response for {silent_s:.1f} s and no liveness record (heartbeat stopped)"
                )
            elif not record.waiting_for_memory_manager:
                stalled[executor_id] = (
                    f"no response for {silent_s:.1f} s and no engine step for "
                    f"{now - progress.moved_at:.1f} s (step counter at {record.load.num_steps})"
                )
        for executor_id in stalled:
            del self._progress[executor_id]  # judged; what waits on it later starts afresh
        return stalled

    def _observe(self, executor_id: str, record: ExecutorRecord | None, now: float) -> _Progress:
        progress = self._progress.get(executor_id)
        if progress is None:
            if record is None:
                progress = _Progress(None, now)
            else:
                progress = _Progress(record.load.num_steps, now, record.layers_run)
            self._progress[executor_id] = progress
        elif record is not None and (
            record.load.num_steps != progress.num_steps
            or record.layers_run != progress.layers_run
            or record.waiting_for_memory_manager
        ):
            # A step finished or a layer ran (or the counters reset: a new incarnation), or the
            # executor waits for its memory manager, which counts as alive. A record that
            # vanished is no progress: its counters are as they were last seen.
            progress.num_steps, progress.moved_at = record.load.num_steps, now
            progress.layers_run = record.layers_run
        return progress


class StreamOwner(Protocol):
    """What the watch needs of the dispatcher (services/router/dispatch.py)."""

    def waiting_reads(self) -> dict[str, float]: ...

    def lose_executor(self, executor_id: str, reason: str) -> int: ...


class StallWatch:
    """Runs a `StallDetector` every `check_s` seconds while this router waits on executors."""

    def __init__(
        self,
        detector: StallDetector,
        streams: StreamOwner,
        directory: ExecutorDirectory,
        on_stalled: Callable[[], None] = lambda: None,
        check_s: float | None = None,
    ) -> None:
        self.detector = detector
        self.streams = streams
        self.directory = directory
        self.on_stalled = on_stalled  # counts each stalled executor (a metric)
        self.check_s = check_s if check_s is not None else min(1.0, detector.stall_s / 4)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="stall-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def check(self) -> dict[str, str]:
        """One round: lose every stalled executor; what was lost, with the reasons."""
        waiting = self.streams.waiting_reads()
        if not waiting:
            self.detector.stalled({}, ClusterView([], "redis"))  # forget everything
            return {}
        stalled = self.detector.stalled(waiting, await self.directory.view())
        for executor_id, reason in stalled.items():
            log.warning("executor stalled", executor_id=executor_id, reason=reason)
            self.on_stalled()
            self.streams.lose_executor(executor_id, f"stalled: {reason}")
        return stalled

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            try:
                await self.check()
            except Exception:  # never let one bad round end the watch
                log.exception("stall check failed")
