"""Pulling offered blocks from a peer executor over its ReadBlocks call.

Runs on the engine thread inside a step (the scheduler calls `pull` when an admitted prompt
comes with a PullOffer): one streaming call per offer, every block checked for length and
CRC-32 as it arrives. The leading blocks that arrived whole are written into the prompt's
blocks; from the first missing, short or corrupted one on (the source died, the call timed
out, the source refused) the rest is computed instead, so a failing pull costs at most its
timeout and never a wrong token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc
import structlog

from quire.block.allocator import PullOffer
from quire.cache.block_transfer import PullStats, checksum, layout, rows_from_bytes
from quire.cache.paged_kv import PagedKVCache
from services.common import tls
from services.rpc import executor_pb2 as pb
from services.rpc import executor_pb2_grpc as pb_grpc

log = structlog.get_logger("quire.executor.pull")


class GrpcBlockPuller:
    """A `quire.engine.scheduler.BlockPuller` over peers' ReadBlocks."""

    def __init__(
        self,
        kv: PagedKVCache,
        timeout_s: float = 5.0,
        tls_ca: str = "",
    ) -> None:
        self.kv = kv
        self.layout = layout(kv)
        self.timeout_s = timeout_s  # one pull's deadline; past it, the rest is computed
        self.tls_ca = tls_ca  # dial peers over TLS against this CA bundle ('' = plaintext)
        self._stubs: dict[str, pb_grpc.ExecutorStub] = {}
        self._channels: list[grpc.Channel] = []
        self.stats = PullStats()

    def pull(self, offer: PullOffer, block_ids: Sequence[int]) -> int:
        started = time.perf_counter()
        request = pb.ReadBlocksRequest(
            granted_by=offer.granted_by, block_ids=offer.source_block_ids, layout=self.layout
        )
        received: list[bytes] = []
        try:
            for message in self._stub(offer.source_address).ReadBlocks(
                request, timeout=self.timeout_s
            ):
                if (
                    message.index != len(received)
                    or len(message.data) != self.kv.bytes_per_block
                    or checksum(message.data) != message.crc32
                ):
                    log.warning(
                        "pulled block rejected",
                        source=offer.source_executor_id,
                        index=message.index,
                    )
                    break
                received.append(message.data)
                if len(received) == len(block_ids):
                    break
        except grpc.RpcError as exc:
            log.warning(
                "pull failed; computing instead",
                source=offer.source_executor_id,
                code=exc.code().name,
                num_received=len(received),
            )
        if received:
            self.kv.write_blocks(block_ids[: len(received)], rows_from_bytes(self.kv, received))
        seconds = time.perf_counter() - started
        self.stats.record(len(block_ids), len(received), self.kv.bytes_per_block, seconds)
        return len(received)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self._stubs.clear()
        self._channels.clear()

    def _stub(self, address: str) -> pb_grpc.ExecutorStub:
        stub = self._stubs.get(address)
        if stub is None:
            options = (("grpc.max_receive_message_length", 64 * 1024 * 1024),)
            channel = tls.channel(address, self.tls_ca, options)
            self._channels.append(channel)
            stub = self._stubs[address] = pb_grpc.ExecutorStub(channel)
        return stub
