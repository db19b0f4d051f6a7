"""The machine under the offline benchmark: CPU, versions, load, peak matmul FLOP/s, peak RSS."""

from __future__ import annotations

import functools
import math
import os
import platform
import resource
from pathlib import Path
from time import perf_counter
from typing import Any

import torch

from benchmarks.offline.config import MATMUL_PROBE_S, MATMUL_SIZE


@functools.cache
def matmul_size(dtype: torch.dtype, n: int = MATMUL_SIZE) -> int:
    """The square matmul that stands for `dtype`'s peak here: [n, n], or the largest power of two
    from 256 whose product took under MATMUL_PROBE_S / 8 (the next size's would take 8 times
    as long), so that a dtype this CPU has no fast GEMM for (torch's own bfloat16 without
    AVX512_BF16 or AMX takes minutes at 2048) is measured in seconds."""
    size = min(256, n)
    while size < n:
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        torch.matmul(a, b)  # warm the allocator and the BLAS threads
        start = perf_counter()
        torch.matmul(a, b)
        if 8 * (perf_counter() - start) > MATMUL_PROBE_S:
            break
        size *= 2
    return size


def matmul_flops(dtype: torch.dtype, repeats: int = 5) -> float:
    """Best FLOP/s of one square matmul of `matmul_size` in `dtype` over a few repeats."""
    n = matmul_size(dtype)
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm the allocator and the BLAS threads
    best = math.inf
    for _ in range(repeats):
        start = perf_counter()
        torch.matmul(a, b, out=out)
        best = min(best, perf_counter() - start)
    return 2 * n**3 / best


def machine_info() -> dict[str, Any]:
    """CPU model, core and thread counts, versions, and the load average now."""
    import transformers

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load_average_start": list(os.getloadavg()),
    }


def reset_peak_rss() -> bool:
    """Start a new peak-RSS window (Linux: `5` into /proc/self/clear_refs resets VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_rss_mib() -> float:
    """This process's peak resident memory since `reset_peak_rss` (VmHWM), else ever, MiB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
