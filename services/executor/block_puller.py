"""Pulling offered blocks from a peer executor over its ReadBlocks call.

Runs on the engine thread inside a step (the scheduler calls `pull` when an admitted prompt
comes with a PullOffer): one streaming call per offer, every block checked for length and
CRC-32 as it arrives. The leading blocks that arrived whole are written into the prompt's
blocks; from the first missing, short or corrupted one on (the source died, the call timed
out, the source refused) the rest is computed instead, so a failing pull costs at most its
timeout and never a wrong token.

A pull runs inside a step, so every stream of this executor waits for it: its deadline is
`DEADLINE_FACTOR` times what its blocks took in this puller's recent whole pulls (at least
`MIN_DEADLINE_S`, at most `timeout_s`; `timeout_s` until one pull has been measured). A source
whose pull timed out or that was unreachable is not pulled from again for `cooldown_s`: a
frozen peer (a paused container, a stuck process) costs its followers one deadline, not one per
offer. (A router's stall bound, --executor-stall-s, must exceed `timeout_s`.)

While it waits for blocks the engine thread runs `while_waiting` (the executor: its queued
peer reads, services/executor/peer_reads.py): the source may be waiting, inside a pull of its
own, for a read of this executor's blocks. The stream is received on a thread of its own and
handed over through a queue, so the engine thread can do both.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import grpc
import structlog

from quire.block.allocator import PullOffer
from quire.cache.block_transfer import PullStats, checksum, layout, rows_from_bytes
from quire.cache.paged_kv import PagedKVCache
from quire.engine.pull_choice import PullCostModel
from services.common import tls
from services.rpc import executor_pb2 as pb
from services.rpc import executor_pb2_grpc as pb_grpc

log = structlog.get_logger("quire.executor.pull")

DEADLINE_FACTOR = 10.0  # a pull's deadline, in multiples of its measured duration
MIN_DEADLINE_S = 0.5  # the shortest deadline (scheduling delays on a loaded host)
# How long the engine thread waits for the next block before it runs `while_waiting` again.
WAIT_SLICE_S = 0.001
# Failures that say the source is unreachable or not answering (not a refused pin).
UNRESPONSIVE = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE})


class GrpcBlockPuller:
    """A `quire.engine.scheduler.BlockPuller` over peers' ReadBlocks."""

    def __init__(
        self,
        kv: PagedKVCache,
        timeout_s: float = 5.0,
        tls_ca: str = "",
        cooldown_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        while_waiting: Callable[[], object] = lambda: None,
    ) -> None:
        self.kv = kv
        self.layout = layout(kv)
        self.timeout_s = timeout_s  # one pull's deadline; past it, the rest is computed
        self.tls_ca = tls_ca  # dial peers over TLS against this CA bundle ('' = plaintext)
        self._stubs: dict[str, pb_grpc.ExecutorStub] = {}
        self._channels: list[grpc.Channel] = []
        self.cooldown_s = cooldown_s  # how long an unresponsive source is left alone
        self.clock = clock
        self.stats = PullStats()
        # Seconds per pulled block, a moving average over whole pulls (its "tokens" are blocks).
        self.measured = PullCostModel()
        self._avoid_until: dict[str, float] = {}  # source address -> when to try it again
        # run on the engine thread while a pull waits for its next block (module docstring)
        self.while_waiting = while_waiting

    def deadline_s(self, num_blocks: int) -> float:
        """The deadline of a pull of `num_blocks` blocks (see the module docstring)."""
        per_block = self.measured.seconds_per_pulled_token
        if per_block is None:
            return self.timeout_s
        expected = DEADLINE_FACTOR * per_block * num_blocks
        return min(self.timeout_s, max(MIN_DEADLINE_S, expected))

    def pull(self, offer: PullOffer, block_ids: Sequence[int]) -> int:
        address = offer.source_address
        if self.clock() < self._avoid_until.get(address, 0.0):
            self.stats.record(len(block_ids), 0, self.kv.bytes_per_block, 0.0)
            return 0
        started = time.perf_counter()
        request = pb.ReadBlocksRequest(
            granted_by=offer.granted_by, block_ids=offer.source_block_ids, layout=self.layout
        )
        received: list[bytes] = []
        call = self._stub(address).ReadBlocks(request, timeout=self.deadline_s(len(block_ids)))
        try:
            for message in self._received(call):
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
            if exc.code() in UNRESPONSIVE:
                self._avoid_until[address] = self.clock() + self.cooldown_s
        finally:
            call.cancel()  # a no-op once the stream ended; frees the receiver when it did not
        if received:
            self.kv.write_blocks(block_ids[: len(received)], rows_from_bytes(self.kv, received))
        seconds = time.perf_counter() - started
        self.stats.record(len(block_ids), len(received), self.kv.bytes_per_block, seconds)
        if received and len(received) == len(block_ids):
            self.measured.observe_pull(len(received), seconds)
        return len(received)

    def _received(self, call: Iterator[pb.BlockData]) -> Iterator[pb.BlockData]:
        """`call`'s messages, received on a thread of their own; the call's RpcError raised
        here. Between messages the engine thread runs `while_waiting`."""
        inbox: queue.SimpleQueue[pb.BlockData | grpc.RpcError | None] = queue.SimpleQueue()

        def receive() -> None:
            try:
                for message in call:
                    inbox.put(message)
                inbox.put(None)
            except grpc.RpcError as exc:
                inbox.put(exc)

        threading.Thread(target=receive, name="pull-receive", daemon=True).start()
        while True:
            try:
                item = inbox.get(timeout=WAIT_SLICE_S)
            except queue.Empty:
                self.while_waiting()
                continue
            if item is None:
                return
            if isinstance(item, grpc.RpcError):
                raise item
            yield item

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
