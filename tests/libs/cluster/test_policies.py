"""The routing policies: exact picks, ring stability when executors join and leave."""

from __future__ import annotations

import pytest

from quire.block.hashing import hash_full_blocks
from quire.cluster.policies import (
    POLICY_NAMES,
    ConsistentHashPolicy,
    LeastLoadedPolicy,
    PrefixPolicy,
    RoundRobinPolicy,
    RoutingRequest,
    make_policy,
)
from quire.cluster.recent import RecentRoutes
from quire.cluster.redis_keys import ExecutorLoad, ExecutorRecord
from quire.cluster.routing import Candidate

PROMPT = list(range(40))
REQUEST = RoutingRequest(PROMPT, hash_full_blocks(PROMPT, 16, "quire-tiny"), 16)


def cand(
    executor_id: str,
    running: int = 0,
    pending: int = 0,
    used: int = 0,
    cached: int = 0,
    draining: bool = False,
) -> Candidate:
    record = ExecutorRecord(
        executor_id,
        f"{executor_id}:1",
        1,
        "quire-tiny",
        ExecutorLoad(num_running=running, kv_blocks_total=100, kv_blocks_used=used),
        draining=draining,
    )
    return Candidate(record, num_cached_blocks=cached, num_pending=pending)


def request_for(i: int) -> RoutingRequest:
    prompt = [1000 + i] * 16 + [7] * 4
    return RoutingRequest(prompt, hash_full_blocks(prompt, 16, "quire-tiny"), 16)


def test_round_robin_cycles_in_id_order_and_skips_excluded() -> None:
    policy = RoundRobinPolicy()
    cands = [cand("ex-c"), cand("ex-a", running=9), cand("ex-b")]
    picks = [policy.choose(cands, REQUEST) for _ in range(4)]
    assert [d.executor_id for d in picks if d] == ["ex-a", "ex-b", "ex-c", "ex-a"]
    # Turn 4 is ex-b's; excluded, the next one takes it.
    d = policy.choose(cands, REQUEST, exclude={"ex-b"})
    assert d is not None and (d.executor_id, d.reason) == ("ex-c", "round_robin")
    assert policy.choose(cands, REQUEST, exclude={"ex-a", "ex-b", "ex-c"}) is None


def test_round_robin_never_picks_draining() -> None:
    policy = RoundRobinPolicy()
    cands = [cand("ex-a"), cand("ex-b", draining=True)]
    assert [policy.choose(cands, REQUEST).executor_id for _ in range(3)] == ["ex-a"] * 3  # type: ignore[union-attr]


def test_least_loaded_uses_the_fresher_of_record_and_router_counts() -> None:
    policy = LeastLoadedPolicy()
    # ex-a's record says 1 running, but this router has 3 in flight there.
    cands = [cand("ex-a", running=1, pending=3), cand("ex-b", running=2), cand("ex-c", running=4)]
    d = policy.choose(cands, REQUEST)
    assert d is not None and (d.executor_id, d.reason) == ("ex-b", "least_loaded")
    assert policy.choose(cands, REQUEST, exclude={"ex-b"}).executor_id == "ex-a"  # type: ignore[union-attr]


def test_least_loaded_breaks_load_ties_by_kv_usage_then_rotates() -> None:
    policy = LeastLoadedPolicy()
    assert (
        policy.choose([cand("ex-a", used=50), cand("ex-b", used=10)], REQUEST).executor_id == "ex-b"
    )  # type: ignore[union-attr]
    idle = [cand("ex-a"), cand("ex-b"), cand("ex-c")]
    picks = [policy.choose(idle, REQUEST).executor_id for _ in range(3)]  # type: ignore[union-attr]
    assert picks == ["ex-b", "ex-c", "ex-a"]  # the tie counter went on from the first call


def test_hash_ignores_load_and_cache() -> None:
    policy = ConsistentHashPolicy()
    ids = ["ex-a", "ex-b", "ex-c"]
    owner = policy.owners(REQUEST.block_hashes[0], ids)[0]
    loaded = [cand(e, running=50 if e == owner else 0, cached=0 if e == owner else 2) for e in ids]
    d = policy.choose(loaded, REQUEST)
    assert d is not None and (d.executor_id, d.reason) == (owner, "hash_ring")
    # Siblings with the same first block go to the same owner; the owner excluded, the next
    # one on the ring takes them.
    sibling = PROMPT[:16] + [9] * 30
    sib = RoutingRequest(sibling, hash_full_blocks(sibling, 16, "quire-tiny"), 16)
    assert policy.choose(loaded, sib).executor_id == owner  # type: ignore[union-attr]
    second = policy.owners(REQUEST.block_hashes[0], ids)[1]
    assert policy.choose(loaded, REQUEST, exclude={owner}).executor_id == second  # type: ignore[union-attr]


def test_hash_ring_keys_move_only_to_a_joining_executor() -> None:
    policy = ConsistentHashPolicy()
    keys = [request_for(i).block_hashes[0] for i in range(400)]
    before = {k: policy.owners(k, ["ex-a", "ex-b", "ex-c"])[0] for k in keys}
    after = {k: policy.owners(k, ["ex-a", "ex-b", "ex-c", "ex-d"])[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == "ex-d" for k in moved)
    # About a quarter of the keys move to the newcomer (160 ring points per executor).
    assert 0.15 < len(moved) / len(keys) < 0.35


def test_hash_ring_keys_of_a_leaving_executor_are_the_only_ones_that_move() -> None:
    policy = ConsistentHashPolicy()
    keys = [request_for(i).block_hashes[0] for i in range(400)]
    before = {k: policy.owners(k, ["ex-a", "ex-b", "ex-c"])[0] for k in keys}
    after = {k: policy.owners(k, ["ex-a", "ex-c"])[0] for k in keys}
    for k in keys:
        if before[k] != "ex-b":
            assert after[k] == before[k]
        else:
            assert after[k] in ("ex-a", "ex-c")
    # Every executor owns a share of the keys.
    assert {before[k] for k in keys} == {"ex-a", "ex-b", "ex-c"}


def test_hash_ring_is_the_same_in_every_process() -> None:
    # The owner depends only on the key and the ids: a fresh policy agrees.
    keys = [request_for(i).block_hashes[0] for i in range(20)]
    one, two = ConsistentHashPolicy(), ConsistentHashPolicy()
    ids = ["ex-a", "ex-b", "ex-c"]
    assert [one.owners(k, ids) for k in keys] == [two.owners(k, list(reversed(ids))) for k in keys]


def test_prefix_policy_picks_the_holder_and_spreads_misses_by_load() -> None:
    d = PrefixPolicy().choose([cand("ex-a", cached=2), cand("ex-b"), cand("ex-c")], REQUEST)
    assert d is not None and (d.executor_id, d.reason, d.num_cached_tokens) == (
        "ex-a",
        "prefix_hit",
        32,
    )
    # A miss goes to the least loaded, whatever the hash prefers (ex-c for this prompt).
    d = PrefixPolicy().choose(
        [cand("ex-a", running=1), cand("ex-b"), cand("ex-c", running=1)], REQUEST
    )
    assert d is not None and (d.executor_id, d.reason) == ("ex-b", "load_balance")
    # A saturated holder gives way to the least loaded executor.
    d = PrefixPolicy().choose(
        [cand("ex-a", cached=2, running=12), cand("ex-b", running=1)], REQUEST
    )
    assert d is not None and (d.executor_id, d.reason) == ("ex-b", "prefix_capped")


def test_prefix_policy_counts_tokens_with_the_request_block_size() -> None:
    request = RoutingRequest(PROMPT, hash_full_blocks(PROMPT, 8, "quire-tiny"), 8)
    d = PrefixPolicy().choose([cand("ex-a", cached=3)], request)
    assert d is not None and d.num_cached_tokens == 24


def test_make_policy_by_name() -> None:
    assert [make_policy(n).name for n in POLICY_NAMES] == list(POLICY_NAMES)
    assert [make_policy(n).uses_prefix_cache for n in POLICY_NAMES] == [True, False, False, False]
    with pytest.raises(ValueError, match="unknown routing policy 'random'"):
        make_policy("random")


def test_recent_routes_count_leading_blocks_until_they_expire() -> None:
    recent = RecentRoutes(ttl_s=10.0)
    hashes = hash_full_blocks(list(range(64)), 16, "m")  # 4 blocks
    recent.record(hashes[:2], "ex-a", now=0.0)
    recent.record(hashes, "ex-b", now=1.0)  # takes over blocks 0 and 1 too
    assert recent.leading_blocks(hashes, now=5.0) == {"ex-b": 4}
    recent.record(hashes[:1], "ex-c", now=2.0)
    # ex-b was sent block 3, so it holds 0..3 whoever was sent block 0 last.
    assert recent.leading_blocks(hashes, now=5.0) == {"ex-c": 1, "ex-b": 4}
    # ex-b's routes expire first; ex-c's block 0 is left, then nothing.
    assert recent.leading_blocks(hashes, now=11.5) == {"ex-c": 1}
    assert recent.leading_blocks(hashes, now=12.5) == {}


def test_recent_routes_are_bounded_and_can_be_off() -> None:
    recent = RecentRoutes(ttl_s=10.0, max_entries=3)
    hashes = hash_full_blocks(list(range(80)), 16, "m")  # 5 blocks
    recent.record(hashes, "ex-a", now=0.0)
    assert len(recent) == 3
    assert recent.leading_blocks(hashes, now=1.0) == {}  # the oldest (leading) blocks went
    off = RecentRoutes(ttl_s=0.0)
    off.record(hashes, "ex-a", now=0.0)
    assert len(off) == 0
    with pytest.raises(ValueError):
        RecentRoutes(ttl_s=-1.0)


def test_prefix_policy_keeps_a_burst_of_siblings_together() -> None:
    # Nobody's Redis set shows the new prefix yet; the first sibling goes by load, the next
    # ones follow it while it is remembered, even a little busier.
    policy = PrefixPolicy(recent=RecentRoutes(ttl_s=30.0))
    first = policy.choose([cand("ex-a", running=1), cand("ex-b")], REQUEST)
    assert first is not None and first.executor_id == "ex-b"
    sibling_ids = PROMPT[:32] + [1, 2, 3]
    sibling = RoutingRequest(sibling_ids, hash_full_blocks(sibling_ids, 16, "quire-tiny"), 16, 1.0)
    d = policy.choose([cand("ex-a", running=1), cand("ex-b", running=1)], sibling)
    assert d is not None and (d.executor_id, d.reason, d.num_cached_tokens) == (
        "ex-b",
        "prefix_hit",
        32,
    )
    # Without the memory (the default) the sibling is a miss spread by load.
    forgetful = PrefixPolicy()
    forgetful.choose([cand("ex-a", running=1), cand("ex-b")], REQUEST)
    d = forgetful.choose([cand("ex-a"), cand("ex-b", running=1)], sibling)
    assert d is not None and (d.executor_id, d.reason) == ("ex-a", "load_balance")
