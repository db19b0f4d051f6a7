"""Other processes' CPU use while a block of code runs: what tells a timing taken on a busy
machine from one taken on a quiet one.

A timing of OpenMP kernels is only as good as the cores it got: when another process takes
one of the cores a parallel region's threads need, every region waits on a descheduled thread
and the kernel looks several times slower than it is, while a kernel that happens to run on
one thread looks unhurt. The linear backends' tuning (quire.model.linear) times its candidates
inside `OtherLoad` and takes a timing again when other processes held the cores its threads
needed.
"""

from __future__ import annotations

import os
import time
from types import TracebackType
from typing import Any

import psutil


def _busy_seconds(times: Any) -> float:
    """A CPU's busy time in psutil's cpu_times (idle and iowait excluded; guest time is
    already inside user time on Linux, so it is not added again)."""
    return sum(
        getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal")
    )


def _own_cpus() -> list[int] | None:
    """The CPUs this process may run on, or None where the platform does not say."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    return sorted(getaffinity(0)) if getaffinity is not None else None


class OtherLoad:
    """Context manager: `cores` after the block is the mean number of cores that other
    processes kept busy meanwhile, over the CPUs this process may run on (`num_cpus`); steal
    time (a hypervisor's other guests) counts as theirs. Time resolution is the kernel's
    accounting tick (10 ms per CPU), so a block should run for a few hundred milliseconds."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._cpus = _own_cpus()
        self.num_cpus = len(self._cpus) if self._cpus else (os.cpu_count() or 1)
        self.cores = 0.0
        self._start: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def _sample(self) -> tuple[float, float, float]:
        """(monotonic time, busy seconds of our CPUs, this process's own CPU seconds)."""
        per_cpu = psutil.cpu_times(percpu=True)
        chosen = (
            per_cpu if self._cpus is None else [per_cpu[i] for i in self._cpus if i < len(per_cpu)]
        )
        own = self._process.cpu_times()
        busy = sum(_busy_seconds(t) for t in chosen)
        return time.monotonic(), busy, own.user + own.system

    def __enter__(self) -> OtherLoad:
        self._start = self._sample()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        end = self._sample()
        wall = max(end[0] - self._start[0], 1e-9)
        others = (end[1] - self._start[1]) - (end[2] - self._start[2])
        self.cores = max(0.0, others / wall)

    def left_free(self, threads: int, slack_cores: float) -> bool:
        """Whether the others left `threads` of our CPUs free (up to `slack_cores` of them
        taken: a poll here, a log line there)."""
        return self.cores <= max(0, self.num_cpus - threads) + slack_cores
