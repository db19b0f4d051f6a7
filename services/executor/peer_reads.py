"""Block reads for peers, run on the engine thread: between steps, and while a step waits.

A peer's ReadBlocks copies blocks out of this executor's KV tensors. The copy runs on the
engine thread (a second thread running torch's parallel work leaves two OpenMP pools alive:
engine_loop.EngineThread), so it waits for the step in progress. A step can itself be waiting
on a peer, inside a pull (block_puller.GrpcBlockPuller); if the peer is at that moment pulling
from this executor, each step waits for the other's read. Run only between steps, both reads
would wait out their pulls' deadlines and both prompts be computed. So a pull, while it waits
for its blocks, runs the reads queued here (`run_pending`), and the loop runs them before
every step.

Running a read inside a step is safe because it touches nothing a step changes: the blocks
are pinned for the peer by the memory manager (never evicted nor reused while pinned) and
full and committed (never written again), and the check of the pin reads only which manager
the allocator registered with.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from services.executor.call_futures import resolve

T = TypeVar("T")


class PeerReads:
    """A queue of peers' block reads that the engine thread drains."""

    def __init__(self) -> None:
        self._pending: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        # Called after every submit, from the submitting thread: wakes an idle engine loop.
        self.wake: Callable[[], None] = lambda: None

    def submit(self, read: Callable[[], T]) -> Future[T]:
        """Queue `read` for the engine thread; its result or error in the Future.
        RuntimeError once closed (nothing would run it)."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine loop is stopped")
            self._pending.put(lambda: resolve(read, future))
        self.wake()
        return future

    def close(self) -> None:
        """Refuse further reads (those queued still run at the next `run_pending`)."""
        with self._lock:
            self._closed = True

    def has_pending(self) -> bool:
        return not self._pending.empty()

    def run_pending(self) -> int:
        """Run every queued read (on the engine thread); how many ran."""
        num_run = 0
        while True:
            try:
                run = self._pending.get_nowait()
            except queue.Empty:
                return num_run
            run()
            num_run += 1
