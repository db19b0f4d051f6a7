"""The pull's two ends without a cluster: a fake peer streaming crafted blocks to the puller
(only blocks that arrive whole and checked are written), and the reader's refusals."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
import torch

from quire.block import BlockManager
from quire.block.allocator import PullOffer
from quire.cache.block_transfer import block_bytes, checksum, layout
from quire.cache.paged_kv import PagedKVCache
from quire.model.model_config import ModelConfig
from services.executor.block_puller import MIN_DEADLINE_S, GrpcBlockPuller
from services.executor.block_reads import ReadRefused, read_blocks
from services.executor.peer_reads import PeerReads
from services.rpc import executor_pb2 as pb
from services.rpc import executor_pb2_grpc
from services.stack.ports import free_port
from tests.checkpoints import tiny_checkpoint

NUM_BLOCKS, BLOCK_SIZE = 8, 16


@pytest.fixture(scope="module")
def source() -> PagedKVCache:
    config = ModelConfig.from_pretrained(tiny_checkpoint())
    kv = PagedKVCache(config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    for k, v in kv.layers:
        k.copy_(torch.randn(k.shape, generator=gen))
        v.copy_(torch.randn(v.shape, generator=gen))
    return kv


def empty_like(kv: PagedKVCache) -> PagedKVCache:
    config = ModelConfig.from_pretrained(tiny_checkpoint())
    return PagedKVCache(config, NUM_BLOCKS, BLOCK_SIZE, kv.dtype, torch.device("cpu"))


class FakePeer(executor_pb2_grpc.ExecutorServicer):
    """Streams the requested blocks of `kv`, spoiled as `spoil(index, message)` says."""

    def __init__(
        self,
        kv: PagedKVCache,
        spoil: object = None,
        fail_after: int | None = None,
        hang_s: float = 0.0,
    ):
        self.kv, self.spoil, self.fail_after, self.hang_s = kv, spoil, fail_after, hang_s
        self.calls = 0

    def ReadBlocks(  # noqa: N802
        self, request: pb.ReadBlocksRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.BlockData]:
        self.calls += 1
        time.sleep(self.hang_s)  # a frozen peer: the call is accepted, nothing comes
        rows = block_bytes(self.kv.read_blocks(list(request.block_ids)))
        for index, data in enumerate(rows):
            if self.fail_after is not None and index == self.fail_after:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the peer went away")
            message = pb.BlockData(index=index, data=data, crc32=checksum(data))
            if callable(self.spoil):
                message = self.spoil(index, message)
            yield message


def serve(peer: FakePeer) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    executor_pb2_grpc.add_ExecutorServicer_to_server(peer, server)
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    server.start()
    return server, address


def offer(address: str, source_ids: tuple[int, ...]) -> PullOffer:
    return PullOffer("pin", "peer", address, "manager/1", 0, source_ids)


def pull(
    peer: FakePeer, source_ids: tuple[int, ...], dest_ids: list[int]
) -> tuple[int, PagedKVCache, GrpcBlockPuller]:
    destination = empty_like(peer.kv)
    server, address = serve(peer)
    puller = GrpcBlockPuller(destination, timeout_s=5.0)
    try:
        return puller.pull(offer(address, source_ids), dest_ids), destination, puller
    finally:
        puller.close()
        server.stop(None)


def test_blocks_arrive_bit_for_bit(source: PagedKVCache) -> None:
    num, destination, puller = pull(FakePeer(source), (5, 2, 7), [1, 3, 4])
    assert num == 3
    assert torch.equal(destination.read_blocks([1, 3, 4]), source.read_blocks([5, 2, 7]))
    stats = puller.stats
    assert (stats.num_pulls, stats.num_blocks, stats.num_fallbacks) == (1, 3, 0)
    assert stats.num_bytes == 3 * source.bytes_per_block


@pytest.mark.parametrize(
    "spoil",
    [
        lambda i, m: pb.BlockData(index=i, data=m.data, crc32=m.crc32 ^ 1) if i == 1 else m,
        lambda i, m: (
            pb.BlockData(index=i, data=m.data[:-4], crc32=checksum(m.data[:-4])) if i == 1 else m
        ),
        lambda i, m: pb.BlockData(index=i + 1, data=m.data, crc32=m.crc32) if i == 1 else m,
    ],
    ids=["corrupted", "short", "out-of-order"],
)
def test_a_bad_block_is_never_written_and_the_rest_is_computed(
    source: PagedKVCache, spoil: object
) -> None:
    num, destination, puller = pull(FakePeer(source, spoil), (5, 2, 7), [1, 3, 4])
    assert num == 1  # only the block before the bad one
    assert torch.equal(destination.read_blocks([1]), source.read_blocks([5]))
    untouched = empty_like(source).read_blocks([3, 4])
    assert torch.equal(destination.read_blocks([3, 4]), untouched)
    assert puller.stats.num_fallbacks == 1


def test_a_peer_that_goes_away_mid_stream_leaves_what_arrived(source: PagedKVCache) -> None:
    num, destination, _ = pull(FakePeer(source, fail_after=2), (5, 2, 7), [1, 3, 4])
    assert num == 2
    assert torch.equal(destination.read_blocks([1, 3]), source.read_blocks([5, 2]))


def test_an_unreachable_peer_means_nothing_pulled(source: PagedKVCache) -> None:
    puller = GrpcBlockPuller(empty_like(source), timeout_s=1.0)
    assert puller.pull(offer(f"127.0.0.1:{free_port()}", (1, 2)), [0, 1]) == 0
    assert puller.stats.num_fallbacks == 1
    puller.close()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_unresponsive_source_is_left_alone_for_the_cooldown(source: PagedKVCache) -> None:
    peer = FakePeer(source, fail_after=0)  # every call ends UNAVAILABLE
    server, address = serve(peer)
    clock = Clock()
    puller = GrpcBlockPuller(empty_like(source), timeout_s=5.0, cooldown_s=10.0, clock=clock)
    try:
        assert puller.pull(offer(address, (1, 2)), [0, 1]) == 0
        assert peer.calls == 1
        clock.now = 9.9  # within the cooldown: computed without asking the peer
        assert puller.pull(offer(address, (1, 2)), [0, 1]) == 0
        assert peer.calls == 1
        assert puller.stats.num_fallbacks == 2
        clock.now = 10.1  # past it: asked again
        assert puller.pull(offer(address, (1, 2)), [0, 1]) == 0
        assert peer.calls == 2
    finally:
        puller.close()
        server.stop(None)


def test_a_frozen_source_costs_a_deadline_scaled_to_measured_pulls(source: PagedKVCache) -> None:
    healthy_server, healthy = serve(FakePeer(source))
    frozen_peer = FakePeer(source, hang_s=3.0)
    frozen_server, frozen = serve(frozen_peer)
    puller = GrpcBlockPuller(empty_like(source), timeout_s=5.0)
    try:
        assert puller.deadline_s(2) == 5.0  # nothing measured yet
        assert puller.pull(offer(healthy, (1, 2)), [0, 1]) == 2
        assert puller.measured.seconds_per_pulled_token is not None
        assert MIN_DEADLINE_S <= puller.deadline_s(2) < 5.0
        started = time.monotonic()
        assert puller.pull(offer(frozen, (1, 2)), [2, 3]) == 0
        # It gave up at the measured deadline, not the 5 s one, nor when the peer woke.
        assert time.monotonic() - started < 2.5
        assert frozen_peer.calls == 1
    finally:
        puller.close()
        healthy_server.stop(None)
        frozen_server.stop(None)


class EngineThreadReads(executor_pb2_grpc.ExecutorServicer):
    """Serves `kv`'s blocks the way an executor does: each read queued for its engine thread
    (`reads`), the call waiting until that thread ran it."""

    def __init__(self, kv: PagedKVCache, reads: PeerReads) -> None:
        self.kv, self.reads = kv, reads

    def ReadBlocks(  # noqa: N802
        self, request: pb.ReadBlocksRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.BlockData]:
        rows = self.reads.submit(lambda: block_bytes(self.kv.read_blocks(list(request.block_ids))))
        for index, data in enumerate(rows.result(timeout=30)):
            yield pb.BlockData(index=index, data=data, crc32=checksum(data))


def test_two_executors_pulling_from_each_other_at_once_both_get_their_blocks(
    source: PagedKVCache,
) -> None:
    # Each side's engine thread is inside a pull from the other when the other's read of its
    # blocks arrives: run only between steps, neither read would run before both deadlines.
    kvs = [source, empty_like(source)]
    kvs[1].write_blocks([6, 7], source.read_blocks([3, 4]))
    reads = [PeerReads(), PeerReads()]
    servers = [serve(EngineThreadReads(kv, r)) for kv, r in zip(kvs, reads, strict=True)]
    deadline_s = 3.0
    pullers = [
        GrpcBlockPuller(empty_like(source), timeout_s=deadline_s, while_waiting=r.run_pending)
        for r in reads
    ]
    both_pulling = threading.Barrier(2)
    pulled = [threading.Event(), threading.Event()]

    def engine_thread(side: int, source_ids: tuple[int, ...]) -> tuple[int, float]:
        both_pulling.wait()
        started = time.monotonic()
        num = pullers[side].pull(offer(servers[1 - side][1], source_ids), [0, 1])
        seconds = time.monotonic() - started
        pulled[side].set()
        # between steps an engine loop runs its queued reads: the other side's may still come
        while not pulled[1 - side].wait(0.001):
            reads[side].run_pending()
        return num, seconds

    try:
        with futures.ThreadPoolExecutor(2) as pool:
            outcomes = list(pool.map(engine_thread, [0, 1], [(6, 7), (1, 2)]))
    finally:
        for puller in pullers:
            puller.close()
        for server, _ in servers:
            server.stop(None)
    assert [num for num, _ in outcomes] == [2, 2]
    assert all(seconds < deadline_s / 2 for _, seconds in outcomes), outcomes
    assert torch.equal(pullers[0].kv.read_blocks([0, 1]), source.read_blocks([3, 4]))
    assert torch.equal(pullers[1].kv.read_blocks([0, 1]), source.read_blocks([1, 2]))


def test_reads_are_refused_without_a_pin_of_the_current_manager(source: PagedKVCache) -> None:
    def request(**fields: object) -> pb.ReadBlocksRequest:
        defaults: dict[str, object] = {
            "granted_by": "manager/1",
            "block_ids": [1, 2],
            "layout": layout(source),
        }
        return pb.ReadBlocksRequest(**{**defaults, **fields})  # type: ignore[arg-type]

    # An executor with an in-process allocator is registered with no manager: nothing pins.
    with pytest.raises(ReadRefused) as refused:
        read_blocks(source, BlockManager(NUM_BLOCKS, BLOCK_SIZE), request())
    assert refused.value.precondition


class Registered:
    """The part of RemoteBlockAllocator the reader looks at."""

    manager_instance = "manager/2"


def test_a_pin_from_another_manager_instance_or_layout_is_refused(
    source: PagedKVCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    import services.executor.block_reads as block_reads

    monkeypatch.setattr(block_reads, "RemoteBlockAllocator", Registered)
    allocator = Registered()
    good = pb.ReadBlocksRequest(granted_by="manager/2", block_ids=[1, 2], layout=layout(source))
    assert [m.index for m in read_blocks(source, allocator, good)] == [0, 1]  # type: ignore[arg-type]
    stale = pb.ReadBlocksRequest(granted_by="manager/1", block_ids=[1], layout=layout(source))
    with pytest.raises(ReadRefused, match="granted by 'manager/1'") as refused:
        read_blocks(source, allocator, stale)  # type: ignore[arg-type]
    assert refused.value.precondition
    other = pb.ReadBlocksRequest(granted_by="manager/2", block_ids=[1], layout="torch.bfloat16:1")
    with pytest.raises(ReadRefused, match="layout"):
        read_blocks(source, allocator, other)  # type: ignore[arg-type]
    bad_ids = pb.ReadBlocksRequest(granted_by="manager/2", block_ids=[99], layout=layout(source))
    with pytest.raises(ReadRefused) as refused:
        read_blocks(source, allocator, bad_ids)  # type: ignore[arg-type]
    assert not refused.value.precondition
