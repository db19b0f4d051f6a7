"""Whole blocks moving between executors' KV caches: what must match, and how bytes are checked.

A block leaves one cache as `PagedKVCache.read_blocks` rows and enters another through
`write_blocks`; both caches must lay blocks out alike (`layout`: dtype and per-block shape,
which covers the model's layers, KV heads, head size and the block size). Each block travels
with a checksum of its bytes; a block whose bytes arrive short or changed is never written.
`InProcessPuller` moves blocks between caches of one process (tests, one-process clusters);
the executor's gRPC puller (services/executor) moves the same rows over the network.
"""

from __future__ import annotations

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
        self.stats.num_pulls += 1
        source = self.sources.get(offer.source_executor_id)
        if source is None or layout(source) != layout(self.destination):
            self.stats.num_fallbacks += 1
            return 0
        rows = source.read_blocks(offer.source_block_ids)
        self.destination.write_blocks(block_ids, rows)
        self.stats.num_blocks += len(block_ids)
        self.stats.num_bytes += len(block_ids) * self.destination.bytes_per_block
        return len(block_ids)
