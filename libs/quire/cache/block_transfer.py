"""Whole blocks moving between executors' KV caches: what must match, and how bytes are checked.

A block leaves one cache as `PagedKVCache.read_blocks` rows and enters another through
`write_blocks`; both caches must lay blocks out alike (`layout`: dtype and per-block shape,
which covers the model's layers, KV heads, head size and the block size). Each block travels
with a checksum of its bytes; a block whose bytes arrive short or changed is never written.
`InProcessPuller` moves blocks between caches of one process (tests, one-process clusters);
the executor's gRPC puller (services/executor) moves the same rows over the network.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

import torch

from quire.block.allocator import PullOffer
from quire.cache.paged_kv import PagedKVCache


def layout(kv: PagedKVCache) -> str:
    """What a peer's blocks must match to be written here, e.g. 'torch.float32:30x2x16x3x64'."""
    return f"{kv.dtype}:{'x'.join(str(d) for d in kv.block_shape)}"


def block_bytes(rows: torch.Tensor) -> list[bytes]:
    """Each row of a `read_blocks` buffer as bytes."""
    flat = rows.contiguous().view(torch.uint8).reshape(rows.shape[0], -1)
    return [row.numpy().tobytes() for row in flat]


def checksum(data: bytes) -> int:
    """CRC-32 of one block's bytes."""
    return zlib.crc32(data)


def rows_from_bytes(kv: PagedKVCache, blocks: Sequence[bytes]) -> torch.Tensor:
    """`write_blocks`' buffer for these blocks' bytes (each exactly one block long)."""
    if any(len(data) != kv.bytes_per_block for data in blocks):
        raise ValueError(f"every block must be {kv.bytes_per_block} bytes")
    flat = torch.frombuffer(bytearray(b"".join(blocks)), dtype=torch.uint8)
    return flat.view(kv.dtype).reshape(len(blocks), *kv.block_shape)


@dataclass
class PullStats:
    """What a puller moved since it started (executor metrics: quire_executor_pull_*)."""

    num_pulls: int = 0  # offers it acted on
    num_blocks: int = 0  # blocks written and verified
    num_bytes: int = 0
    seconds: float = 0.0  # wall time of the pulls, transfer and write
    num_fallbacks: int = 0  # pulls that got fewer blocks than offered (the rest computed)
    num_declined: int = 0  # offers not taken: computing was measured cheaper

    def record(self, num_offered: int, num_written: int, block_bytes: int, seconds: float) -> None:
        """One pull: `num_written` of `num_offered` blocks of `block_bytes` each, in `seconds`."""
        self.num_pulls += 1
        self.num_blocks += num_written
        self.num_bytes += num_written * block_bytes
        self.seconds += seconds
        self.num_fallbacks += num_written < num_offered

    def since(self, earlier: PullStats) -> PullStats:
        """What was pulled after `earlier` (a copy of these stats taken before)."""
        return PullStats(
            *(getattr(self, f.name) - getattr(earlier, f.name) for f in fields(PullStats))
        )


def snapshot(stats: PullStats) -> PullStats:
    return replace(stats)


class InProcessPuller:
    """Pulls from peers' caches in this process (`sources`: executor id -> its cache)."""

    def __init__(self, sources: Mapping[str, PagedKVCache], destination: PagedKVCache) -> None:
        self.sources = sources
        self.destination = destination
        self.stats = PullStats()

    def pull(self, offer: PullOffer, block_ids: Sequence[int]) -> int:
        started = time.perf_counter()
        source = self.sources.get(offer.source_executor_id)
        num_written = 0
        if source is not None and layout(source) == layout(self.destination):
            self.destination.write_blocks(block_ids, source.read_blocks(offer.source_block_ids))
            num_written = len(block_ids)
        seconds = time.perf_counter() - started
        self.stats.record(len(block_ids), num_written, self.destination.bytes_per_block, seconds)
        return num_written
