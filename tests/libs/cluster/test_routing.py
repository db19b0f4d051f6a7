"""Routing policy: exact choices for prefix hits, caps, consistent hashing and load."""

from __future__ import annotations

from dataclasses import replace

import pytest

from quire.block.hashing import hash_full_blocks
from quire.cluster.redis_keys import ExecutorLoad, ExecutorRecord
from quire.cluster.routing import (
    Candidate,
    RoutingConfig,
    choose_executor,
    hrw_weight,
    is_overloaded,
    routing_key,
)

EXTRA_KEY = "quire-tiny"
PROMPT = list(range(40))  # 2 full blocks of 16 + a partial one
HASHES = hash_full_blocks(PROMPT, 16, EXTRA_KEY)
# HRW order of ex-a/ex-b/ex-c for HASHES[0] is c, b, a; for the short prompt [5, 6, 7] b, c, a.
SHORT = [5, 6, 7]


def cand(
    executor_id: str,
    cached: int = 0,
    running: int = 0,
    waiting: int = 0,
    pending: int = 0,
    used: int = 0,
    draining: bool = False,
) -> Candidate:
    record = ExecutorRecord(
        executor_id=executor_id,
        address=f"{executor_id}:1",
        epoch=1,
        model="quire-tiny",
        load=ExecutorLoad(
            num_running=running, num_waiting=waiting, kv_blocks_total=100, kv_blocks_used=used
        ),
        draining=draining,
    )
    return Candidate(record, num_cached_blocks=cached, num_pending=pending)


def choose(cands: list[Candidate], prompt: list[int] = PROMPT, **kw: object):  # type: ignore[no-untyped-def]
    hashes = hash_full_blocks(prompt, 16, EXTRA_KEY)
    return choose_executor(cands, hashes, prompt, **kw)  # type: ignore[arg-type]


def test_hrw_order_is_stable() -> None:
    ids = ["ex-a", "ex-b", "ex-c"]
    assert sorted(ids, key=lambda i: -hrw_weight(HASHES[0], i)) == ["ex-c", "ex-b", "ex-a"]
    key = routing_key([], SHORT)
    assert key == b"\x05\x00\x00\x00\x06\x00\x00\x00\x07\x00\x00\x00"
    assert sorted(ids, key=lambda i: -hrw_weight(key, i)) == ["ex-b", "ex-c", "ex-a"]


def test_no_prefix_goes_to_consistent_hash_of_first_block() -> None:
    d = choose([cand("ex-a"), cand("ex-b"), cand("ex-c")])
    assert d is not None
    assert (d.executor_id, d.reason, d.num_cached_tokens) == ("ex-c", "consistent_hash", 0)
    assert d.address == "ex-c:1"
    # Order of candidates does not matter.
    d2 = choose([cand("ex-c"), cand("ex-b"), cand("ex-a")])
    assert d2 == d


def test_siblings_with_same_first_block_land_together() -> None:
    a = PROMPT[:16] + [900, 901, 902, 903] * 5
    b = PROMPT[:16] + [700] * 30
    cands = [cand("ex-a"), cand("ex-b"), cand("ex-c")]
    assert choose(cands, a).executor_id == choose(cands, b).executor_id == "ex-c"  # type: ignore[union-attr]


def test_short_prompt_hashes_token_ids() -> None:
    d = choose([cand("ex-a"), cand("ex-b"), cand("ex-c")], SHORT)
    assert d is not None and (d.executor_id, d.reason) == ("ex-b", "consistent_hash")


def test_removing_an_executor_only_moves_its_own_keys() -> None:
    # HRW: dropping ex-a (never first for HASHES) leaves the choice unchanged.
    assert choose([cand("ex-b"), cand("ex-c")]).executor_id == "ex-c"  # type: ignore[union-attr]
    # Dropping the winner moves the key to the second in rank.
    assert choose([cand("ex-a"), cand("ex-b")]).executor_id == "ex-b"  # type: ignore[union-attr]


def test_prefix_hit_wins() -> None:
    d = choose([cand("ex-a", cached=2), cand("ex-b"), cand("ex-c")])
    assert d is not None
    assert (d.executor_id, d.reason, d.num_cached_tokens) == ("ex-a", "prefix_hit", 32)


def test_longest_prefix_wins() -> None:
    d = choose([cand("ex-a", cached=1), cand("ex-b", cached=2), cand("ex-c")])
    assert d is not None and (d.executor_id, d.reason) == ("ex-b", "prefix_hit")


def test_prefix_weighed_against_load() -> None:
    # ex-b: 32 cached - 3 * 16 = -16; ex-a: 16 cached - 0 = 16 -> ex-a.
    d = choose([cand("ex-a", cached=1), cand("ex-b", cached=2, running=3), cand("ex-c")])
    assert d is not None and (d.executor_id, d.reason) == ("ex-a", "prefix_hit")
    # One cached block (16) against one request more (16): tie, the lighter one wins.
    d = choose([cand("ex-a", cached=1, running=1), cand("ex-b"), cand("ex-c", running=1)])
    assert d is not None and (d.executor_id, d.reason) == ("ex-b", "load_balance")


def test_kv_usage_counts_against_a_holder() -> None:
    # ex-a: 32 - 64 * 0.9 = -25.6 < ex-b's 16 - 0.
    d = choose([cand("ex-a", cached=2, used=90), cand("ex-b", cached=1), cand("ex-c")])
    assert d is not None and (d.executor_id, d.reason) == ("ex-b", "prefix_hit")


def test_hot_prefix_is_capped() -> None:
    # ex-a holds the prefix but has 5 queued vs 0: over gap 4 and ratio 2 -> least loaded.
    cands = [cand("ex-a", cached=2, running=5), cand("ex-b", running=1), cand("ex-c")]
    d = choose(cands)
    assert d is not None
    assert (d.executor_id, d.reason, d.num_cached_tokens) == ("ex-c", "prefix_capped", 0)
    # At exactly the gap it keeps the bonus: 160 cached - 4 * 16 = 96 beats the idle ones' 0.
    big = cand("ex-a", cached=10, running=4)
    d = choose([big, cand("ex-b"), cand("ex-c")], list(range(170)))
    assert d is not None and (d.executor_id, d.reason) == ("ex-a", "prefix_hit")


def test_cap_uses_ratio_under_heavy_load() -> None:
    # least load 10: 18 is over the gap (4) but under the ratio (20): not capped.
    assert not is_overloaded(18, 10, RoutingConfig())
    assert is_overloaded(21, 10, RoutingConfig())
    assert is_overloaded(5, 0, RoutingConfig())
    assert not is_overloaded(4, 0, RoutingConfig())
    d = choose(
        [cand("ex-a", cached=2, running=12), cand("ex-b", running=10), cand("ex-c", running=10)],
        list(range(200)),
    )
    # ex-a holds only 2 of the 12 blocks: 32 - 12*16 < ex-b/ex-c's -160; consistent rank decides.
    assert d is not None and d.reason == "load_balance"


def test_pending_count_is_used_when_fresher() -> None:
    # Records say idle, but this router already sent 6 requests to ex-c (the HRW choice).
    d = choose([cand("ex-a"), cand("ex-b"), cand("ex-c", pending=6)])
    assert d is not None
    assert (d.executor_id, d.reason) == ("ex-b", "load_balance")


def test_overloaded_consistent_hash_target_falls_back_to_least_loaded() -> None:
    d = choose([cand("ex-a", running=2), cand("ex-b", running=1), cand("ex-c", running=9)])
    assert d is not None and (d.executor_id, d.reason) == ("ex-b", "load_balance")


def test_new_prompt_goes_to_the_least_loaded_and_hashes_only_between_ties() -> None:
    # ex-c is the HRW choice; one request above the least loaded, the miss goes by load to
    # the least loaded pair, and HRW picks between them (b before a).
    d = choose([cand("ex-a", running=1), cand("ex-b", running=1), cand("ex-c", running=2)])
    assert d is not None and (d.executor_id, d.reason) == ("ex-b", "load_balance")
    # All equally loaded: the HRW choice.
    d = choose([cand("ex-a", running=1), cand("ex-b", running=1), cand("ex-c", running=1)])
    assert d is not None and (d.executor_id, d.reason) == ("ex-c", "consistent_hash")
    # A wider tie band lets the hash keep siblings together at a small imbalance.
    d = choose(
        [cand("ex-a", running=1), cand("ex-b", running=1), cand("ex-c", running=2)],
        config=RoutingConfig(max_hash_load_gap=1),
    )
    assert d is not None and (d.executor_id, d.reason) == ("ex-c", "consistent_hash")
    d = choose(
        [cand("ex-a", running=1), cand("ex-b"), cand("ex-c", running=2)],
        config=RoutingConfig(max_hash_load_gap=2),
    )
    assert d is not None and (d.executor_id, d.reason) == ("ex-c", "consistent_hash")
    with pytest.raises(ValueError):
        RoutingConfig(max_hash_load_gap=-1)


def test_draining_and_excluded_are_never_chosen() -> None:
    d = choose([cand("ex-a"), cand("ex-b"), cand("ex-c", cached=2, draining=True)])
    assert d is not None and (d.executor_id, d.reason) == ("ex-b", "consistent_hash")
    d = choose([cand("ex-a"), cand("ex-b", cached=2), cand("ex-c")], exclude={"ex-b"})
    assert d is not None and (d.executor_id, d.reason) == ("ex-c", "consistent_hash")
    assert choose([cand("ex-a", draining=True)]) is None
    assert choose([], exclude={"x"}) is None


def test_draining_executor_does_not_set_least_load() -> None:
    d = choose(
        [cand("ex-a", draining=True), cand("ex-b", cached=2, running=5), cand("ex-c", running=4)]
    )
    assert d is not None and (d.executor_id, d.reason) == ("ex-b", "prefix_hit")


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="block_size"):
        RoutingConfig(block_size=0)
    with pytest.raises(ValueError, match="max_load_ratio"):
        RoutingConfig(max_load_ratio=0.5)


def test_block_size_scales_cached_tokens() -> None:
    d = choose_executor([cand("ex-a", cached=3)], [b"x" * 16], PROMPT, RoutingConfig(block_size=8))
    assert d is not None and d.num_cached_tokens == 24


def with_fraction(c: Candidate, fraction: float | None) -> Candidate:
    return replace(c, record=replace(c.record, pull_cost_fraction=fraction))


def test_pulled_blocks_are_weighed_at_each_executors_measured_cost() -> None:
    # ex-a holds both blocks (32 tokens) and runs one request; ex-b and ex-c are idle and
    # would pull. Pulled tokens count 1 - fraction each: at the default 0.25 an idle puller
    # scores 24 against the holder's 32 - 16 = 16.
    config = RoutingConfig(pulls=True)
    holder = cand("ex-a", cached=2, running=1)
    d = choose([holder, cand("ex-b"), cand("ex-c")], config=config)
    assert d is not None and d.reason == "prefix_pull" and d.num_cached_tokens == 32
    # Measured: ex-b pulls at 0.1 of a computed token (28.8), ex-c at 0.6 (12.8, below the
    # holder's 16): ex-b.
    d = choose(
        [holder, with_fraction(cand("ex-b"), 0.1), with_fraction(cand("ex-c"), 0.6)],
        config=config,
    )
    assert d is not None and (d.executor_id, d.reason) == ("ex-b", "prefix_pull")
    # Executors that measured pulling dearer than computing are not counted as pullers.
    d = choose(
        [holder, with_fraction(cand("ex-b"), 1.5), with_fraction(cand("ex-c"), 1.0)],
        config=config,
    )
    assert d is not None and (d.executor_id, d.reason) == ("ex-a", "prefix_hit")
