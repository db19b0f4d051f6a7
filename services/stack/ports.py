"""Free loopback ports for stacks started by tests and benchmarks.

Executors listen on consecutive ports (base + i), so a stack needs whole blocks of free
ports, picked below Linux's ephemeral range where the kernel does not hand them out to
other sockets in the meantime.
"""

from __future__ import annotations

import random
import socket


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_range(n: int, taken: set[int]) -> int:
    """The first of `n` consecutive free ports, none in `taken` (they are added to it)."""
    rng = random.Random()
    while True:
        base = rng.randrange(20000, 32000 - n)
        block = range(base, base + n)
        if taken.intersection(block) or not all(port_free(p) for p in block):
            continue
        taken.update(block)
        return base


def free_port() -> int:
    """One free port (see `free_range`)."""
    return free_range(1, set())


def stack_ports(num_executors: int) -> dict[str, int]:
    """Free ports for every listener of one local stack, as `StackConfig` fields."""
    taken: set[int] = set()
    return {
        "executor_base_port": free_range(num_executors, taken),
        "executor_base_metrics_port": free_range(num_executors, taken),
        "router_port": free_range(1, taken),
        "router_admin_port": free_range(1, taken),
        "redis_port": free_range(1, taken),
        "memory_manager_port": free_range(1, taken),
        "memory_manager_metrics_port": free_range(1, taken),
    }
