"""PullBroker over real pools: which peer is offered, the pins it holds and when they end."""

from __future__ import annotations

from quire.block import AdmitRequest, CommitRequest, StepAllocation, StepAllocationResult
from quire.block.hashing import hash_full_blocks
from services.memory_manager.pools import ExecutorPool, ExecutorPools
from services.memory_manager.pull_broker import PullBroker

BS = 4
PROMPT = tuple(range(100, 118))  # 18 tokens: 4 full blocks + 2


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def register(pools: ExecutorPools, executor_id: str, epoch: int = 1) -> ExecutorPool:
    pool, _ = pools.register(
        executor_id, epoch, 16, BS, True, f"{executor_id}:50051", [], accepts_pulls=True
    )
    return pool


def compute(pool: ExecutorPool, seq_id: str, tokens: tuple[int, ...]) -> None:
    """`tokens` admitted, computed and finished on `pool`: its full blocks stay cached."""
    pool.manager.step(StepAllocation(admits=(AdmitRequest(seq_id, tokens),)))
    pool.manager.step(
        StepAllocation(commits=(CommitRequest(seq_id, len(tokens)),), frees=(seq_id,))
    )


def admit(
    broker: PullBroker, pool: ExecutorPool, seq_id: str, tokens: tuple[int, ...]
) -> StepAllocationResult:
    admits = (AdmitRequest(seq_id, tokens),)
    result = pool.manager.step(StepAllocation(admits=admits))
    broker.offer(pool, admits, result)
    return result


def setup() -> tuple[ExecutorPools, PullBroker, Clock]:
    pools = ExecutorPools()
    clock = Clock()
    return pools, PullBroker(pools, "manager-1", lease_s=5.0, clock=clock), clock


def test_offers_the_peer_with_the_longest_run_after_local_hits_and_pins_it() -> None:
    pools, broker, _ = setup()
    dest, short, long = register(pools, "dest"), register(pools, "short"), register(pools, "long")
    compute(dest, "d0", PROMPT[:4])  # the destination holds block 0 itself
    compute(short, "s0", PROMPT[:8])  # blocks 0-1
    compute(long, "l0", PROMPT[:16])  # blocks 0-3
    result = admit(broker, dest, "x", PROMPT)
    assert result.num_cached_tokens == {"x": 4}
    offer = result.pulls["x"]
    hashes = hash_full_blocks(PROMPT, BS)
    assert offer.source_executor_id == "long" and offer.source_address == "long:50051"
    assert offer.first_block == 1 and offer.granted_by == "manager-1"
    assert offer.source_block_ids == tuple(long.manager.pool.lookup(h) for h in hashes[1:4])
    assert [long.manager.pool.refcount(b) for b in offer.source_block_ids] == [1, 1, 1]
    long.manager.check_integrity()
    broker.release([offer.pin_id])
    assert [long.manager.pool.refcount(b) for b in offer.source_block_ids] == [0, 0, 0]
    assert long.manager.pool.num_cached_blocks == 4  # still cached, findable
    assert broker.pins == {} and broker.counters.num_released == 1
    broker.release([offer.pin_id])  # twice, or unknown: ignored


def test_no_offer_for_the_last_tokens_block_not_admitted_or_skipping_the_cache() -> None:
    pools, broker, _ = setup()
    dest, peer = register(pools, "dest"), register(pools, "peer")
    compute(peer, "p0", PROMPT[:16])
    # 16 tokens: the 4th block holds the last token, so only blocks 0-2 can be pulled.
    assert len(admit(broker, dest, "x", PROMPT[:16]).pulls["x"].source_block_ids) == 3
    skip = (AdmitRequest("y", PROMPT, skip_prefix_cache=True),)
    result = dest.manager.step(StepAllocation(admits=skip))
    broker.offer(dest, skip, result)
    assert result.pulls == {}
    big = (AdmitRequest("z", tuple(range(1000, 1100))),)  # needs 25 blocks of 16
    result = dest.manager.step(StepAllocation(admits=big))
    broker.offer(dest, big, result)
    assert result.not_admitted == ["z"] and result.pulls == {}


def test_a_lease_that_runs_out_unpins_and_a_gone_executor_takes_its_pins() -> None:
    pools, broker, clock = setup()
    dest, peer = register(pools, "dest"), register(pools, "peer")
    compute(peer, "p0", PROMPT[:16])
    first = admit(broker, dest, "x", PROMPT).pulls["x"]
    clock.now = 4.9
    broker.expire()
    assert first.pin_id in broker.pins
    clock.now = 5.0
    broker.expire()
    assert broker.pins == {} and broker.counters.num_expired == 1
    assert peer.manager.num_pinned_blocks == 0
    # A destination that restarts never releases its pins: they are dropped.
    second = admit(broker, dest, "y", PROMPT).pulls["y"]
    assert peer.manager.num_pinned_blocks == 4  # blocks 0-3 (18 tokens: the 5th holds the last)
    broker.forget_executor("dest", 1)
    assert second.pin_id not in broker.pins and peer.manager.num_pinned_blocks == 0
    peer.manager.check_integrity()
    # A source that re-registers took its pool (and the references) with it.
    dest2 = register(pools, "dest", epoch=2)
    third = admit(broker, dest2, "z", PROMPT).pulls["z"]
    register(pools, "peer", epoch=2)
    broker.forget_executor("peer", 1)
    assert third.pin_id not in broker.pins


def test_executors_that_do_not_accept_pulls_get_no_offers() -> None:
    pools, broker, _ = setup()
    dest, _ = pools.register("dest", 1, 16, BS, True, "dest:1", [], accepts_pulls=False)
    peer = register(pools, "peer")
    compute(peer, "p0", PROMPT[:16])
    assert admit(broker, dest, "x", PROMPT).pulls == {}
