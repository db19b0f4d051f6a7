"""Weights and KV blocks in transparent huge pages (Linux, CPU).

A decode step streams every weight once, and on a CPU that stream is bound by memory: each 4 KiB
page it crosses costs a TLB miss (a two-level page walk in a virtual machine), and the
hardware prefetchers stop at every page's end. In 2 MiB pages the same bytes cross 512 times
fewer page boundaries. Linux hands anonymous memory out in huge pages where a process asks
(`madvise(MADV_HUGEPAGE)`, which `/sys/kernel/mm/transparent_hugepage/enabled` set to
`madvise` or `always` honours) and the pages are first touched after the advice.

`move_into_huge_pages` copies every tensor a loaded model holds into one such arena, each
tensor re-pointed in place (`Tensor.set_`), so every reference to it (a layer, the fused C++
layer's argument list, a tied head) sees the new memory; `zeros` allocates a KV plane in one.
Where the advice is not available (another OS, THP disabled, a non-CPU tensor) they do
nothing and return plain memory: the pages are a speed matter only, never a correctness one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import math
import sys
from pathlib import Path
from typing import Any

import torch

from quire.model.resident import reachable_tensors

log = logging.getLogger(__name__)

HUGE_PAGE_BYTES = 2 << 20  # x86-64's and arm64's (4 KiB base pages) transparent huge page
_MADV_HUGEPAGE = 14  # linux/mman.h
_ALIGN = 64  # every tensor's start in the arena: a cache line
_THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@functools.cache
def _madvise() -> Any | None:
    """libc's madvise, or None where there is no Linux libc."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    fn = ctypes.CDLL(name, use_errno=True).madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


@functools.cache
def available() -> bool:
    """Whether this kernel gives huge pages to memory that asks: THP `always` or `madvise`."""
    if _madvise() is None:
        return False
    try:
        mode = _THP_ENABLED.read_text()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


def empty_bytes(nbytes: int) -> torch.Tensor:
    """A uint8 CPU tensor of `nbytes` whose whole 2 MiB pages are advised huge, untouched (so
    the first write faults them in as huge pages); plain memory where `available()` is false."""
    if not available() or nbytes < HUGE_PAGE_BYTES:
        return torch.empty(nbytes, dtype=torch.uint8)
    raw = torch.empty(nbytes + HUGE_PAGE_BYTES, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE_BYTES
    arena = raw[start : start + nbytes]
    length = nbytes // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    madvise = _madvise()
    assert madvise is not None  # available() checked it
    if madvise(arena.data_ptr(), length, _MADV_HUGEPAGE) != 0:
        log.info("madvise(MADV_HUGEPAGE) failed (errno %d): plain pages", ctypes.get_errno())
    return arena


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros, in huge pages on a CPU where they are available."""
    if device.type != "cpu" or not available():
        return torch.zeros(shape, dtype=dtype, device=device)
    return empty_bytes(math.prod(shape) * dtype.itemsize).view(dtype).view(shape).zero_()


def _movable(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cpu" and tensor.layout == torch.strided and not tensor.is_mkldnn


@torch.inference_mode()
def move_into_huge_pages(root: Any) -> int:
    """Copy every CPU tensor storage reachable from `root` (quire.model.resident's walk) into
    one huge-page arena and re-point each tensor on it in place; returns the bytes moved (0
    where huge pages are not available). Tensors sharing a storage keep sharing it."""
    if not available():
        return 0
    by_storage: dict[int, list[torch.Tensor]] = {}
    for tensor in reachable_tensors(root):
        if _movable(tensor) and tensor.untyped_storage().nbytes() > 0:
            by_storage.setdefault(tensor.untyped_storage().data_ptr(), []).append(tensor)
    if not by_storage:
        return 0
    offsets: dict[int, int] = {}
    total = 0
    for ptr, tensors in by_storage.items():
        offsets[ptr] = total
        total += -(-tensors[0].untyped_storage().nbytes() // _ALIGN) * _ALIGN
    arena = empty_bytes(total)
    storage = arena.untyped_storage()
    base = arena.data_ptr() - storage.data_ptr()  # the arena's byte offset in its storage
    for ptr, tensors in by_storage.items():
        old = tensors[0].untyped_storage()
        start = offsets[ptr]
        arena[start : start + old.nbytes()].copy_(torch.empty(0, dtype=torch.uint8).set_(old))
        for tensor in tensors:
            elem = tensor.element_size()
            byte_offset = base + start + tensor.storage_offset() * elem
            assert byte_offset % elem == 0, "the arena keeps every start element-aligned"
            tensor.set_(storage, byte_offset // elem, tensor.size(), tensor.stride())
    return total
