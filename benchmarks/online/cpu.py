"""Where a curve point's CPU time goes, process by process: the service path's profile.

Every process on the machine is sampled (psutil) before and after a point; the difference in
user + system CPU seconds is grouped by role, from the command line: Quire's executors (one
group each), router, memory manager and Redis; vLLM's API server and engine core; llama.cpp's
server; and the client (this process and the children it waited for: vLLM's benchmark client).
Per point this gives CPU seconds per role, their share of the machine over the point's wall
time, and CPU milliseconds per output token — what a served token costs each part of the
stack, comparable across systems on the same requests.
"""

from __future__ import annotations

import os
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

T = TypeVar("T")

_EXECUTOR_ID = re.compile(r"--executor-id\s+(\S+)")


def role(cmdline: list[str], name: str) -> str | None:
    """The role a process plays in a served benchmark, None for the machine's other work."""
    line = " ".join(cmdline)
    if "services.executor" in line:
        found = _EXECUTOR_ID.search(line)
        return found.group(1) if found else "executor"
    for module, label in (
        ("services.router", "router"),
        ("services.memory_manager", "memory-manager"),
    ):
        if module in line:
            return label
    if "redis-server" in line or name == "redis-server":
        return "redis"
    if "llama-server" in line:
        return "llama-server"
    if "vllm_bench_serve" in line:
        return None  # vLLM's benchmark client: this process's child, counted as the client
    if name.startswith("VLLM::") or "EngineCore" in name:
        return "vllm-engine"
    if "vllm.entrypoints" in line or (
        cmdline and Path(cmdline[0]).name == "vllm" and "serve" in cmdline
    ):
        return "vllm-api"  # its engine core too where the process keeps the parent's title
    if "transformers" in line and " serve" in line:
        return "transformers-serve"
    return None


@dataclass(frozen=True)
class Sample:
    at: float  # monotonic seconds
    cpu_s: dict[int, tuple[str, float]]  # pid -> (role, user + system seconds)
    client_s: float  # this process and its waited-for children


def _client_seconds() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def sample() -> Sample:
    """Every role-playing process's CPU seconds so far."""
    seen: dict[int, tuple[str, float]] = {}
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "name", "cmdline", "cpu_times"]):
        info = proc.info
        if info["pid"] == me or info["cpu_times"] is None:
            continue
        label = role(info["cmdline"] or [], info["name"] or "")
        if label is not None:
            times = info["cpu_times"]
            seen[info["pid"]] = (label, times.user + times.system)
    return Sample(time.monotonic(), seen, _client_seconds())


def usage(before: Sample, after: Sample) -> dict[str, float]:
    """CPU seconds per role between two samples (a process that started in between counts
    from 0; one that ended in between is not seen after, and is lost unless waited for by
    this process)."""
    seconds: dict[str, float] = defaultdict(float)
    for pid, (label, cpu) in after.cpu_s.items():
        start = before.cpu_s.get(pid)
        seconds[label] += cpu - (start[1] if start and start[0] == label else 0.0)
    seconds["client"] = after.client_s - before.client_s
    return dict(sorted(seconds.items()))


def measured(fn: Callable[[], T]) -> tuple[T, dict[str, Any]]:
    """Run `fn` and report the CPU it took per role: seconds, their share of the machine's
    cores over the wall time, and the wall time."""
    before = sample()
    result = fn()
    after = sample()
    seconds = usage(before, after)
    wall = after.at - before.at
    cores = os.cpu_count() or 1
    return result, {
        "wall_s": wall,
        "cores": cores,
        "cpu_s": seconds,
        "machine_share": {k: v / (wall * cores) for k, v in seconds.items()} if wall else {},
    }


def per_token(profile: dict[str, Any], output_tokens: int) -> dict[str, float]:
    """CPU milliseconds per output token, per role and in all."""
    if not output_tokens:
        return {}
    per = {k: 1000 * v / output_tokens for k, v in profile["cpu_s"].items()}
    per["total"] = sum(per.values())
    return per


def cpu_row(label: str, point: dict[str, Any]) -> str:
    """One printed line: CPU ms per output token per role, and the machine's busy share."""
    per = point.get("cpu_ms_per_output_token") or {}
    parts = ", ".join(f"{k} {v:.1f}" for k, v in per.items() if k != "total" and v >= 0.05)
    busy = sum(point["cpu_profile"]["machine_share"].values())
    return (
        f"  cpu {label} c={point['max_concurrency'] or 'all'}: {per.get('total', 0):.1f} ms per "
        f"output token ({parts}); machine {100 * busy:.0f}% busy"
    )
