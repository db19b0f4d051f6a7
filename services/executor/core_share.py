"""Cores shared by the executors of one machine, split by who has work.

Two executors of one core each keep a machine's two cores busy under load, and that layout
serves a burst best (docs/benchmarks.md); but a lone request then runs on one core while the
other idles. With a shared cores file each executor instead runs every step on

    threads = max(floor, cores // executors with work right now)

torch intra-op threads: a lone request's executor takes every core, and as soon as a sibling
has work too they split them again. The file is a small array of slots in shared memory (a
tmpfs path such as /dev/shm/...), one float64 per executor: 0 while it is idle, else the
CLOCK_MONOTONIC time its current busy spell was last confirmed (every step writes it). A slot
older than `stale_s` counts as idle, so an executor that died busy does not hold its share
forever.

Only the engine thread calls `before_step` and `idle`: torch's thread count is set on the
thread that runs the model (OpenMP's count is per calling thread).
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

import torch

NUM_SLOTS = 64  # executors one file can hold
_SLOT_BYTES = 8  # one float64 per slot
FILE_BYTES = NUM_SLOTS * _SLOT_BYTES


class CoreShare:
    """One executor's view of a shared cores file."""

    def __init__(
        self,
        path: str | Path,
        slot: int,
        cores: int = 0,  # the cores the executors split; 0: this machine's
        floor: int = 1,  # the fewest threads a step runs on
        stale_s: float = 30.0,  # a busy slot not refreshed for this long counts as idle
    ) -> None:
        if not 0 <= slot < NUM_SLOTS:
            raise ValueError(f"share_cores_slot must lie in [0, {NUM_SLOTS}), got {slot}")
        self.cores = cores or os.cpu_count() or 1
        if floor < 1 or floor > self.cores:
            raise ValueError(f"the thread floor must lie in [1, {self.cores}], got {floor}")
        self.slot = slot
        self.floor = floor
        self.stale_s = stale_s
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # Every executor sizes it alike, so concurrent first opens agree (new bytes are 0).
            if os.fstat(fd).st_size < FILE_BYTES:
                os.ftruncate(fd, FILE_BYTES)
            self._map = mmap.mmap(fd, FILE_BYTES)
        finally:
            os.close(fd)
        self._slots = memoryview(self._map).cast("d")
        self.threads = 0  # what the last step ran on (0: no step yet)
        self.idle()

    def busy_executors(self, now: float) -> int:
        """Slots with work whose time is fresh, this executor's included."""
        return sum(1 for t in self._slots if t > 0.0 and now - t < self.stale_s)

    def before_step(self) -> int:
        """Mark this executor busy, count the busy ones and set torch's threads for the
        step to come (every step, as EngineLoop does with a fixed count: set only when it
        changed, the count was seen lost). Returns that count of threads."""
        now = time.monotonic()
        self._slots[self.slot] = now
        self.threads = max(self.floor, self.cores // max(1, self.busy_executors(now)))
        torch.set_num_threads(self.threads)
        return self.threads

    def idle(self) -> None:
        """This executor has no work: its cores are the others'."""
        self._slots[self.slot] = 0.0

    def close(self) -> None:
        self.idle()
        self._slots.release()
        self._map.close()
