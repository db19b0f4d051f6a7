"""Working sets and the placement of new prefixes: exact counts, expiry and choices."""

from __future__ import annotations

from dataclasses import replace

import pytest

from quire.block.hashing import hash_full_blocks
from quire.cluster.placement import WorkingSets
from quire.cluster.policies import PrefixPolicy, RoutingRequest
from quire.cluster.redis_keys import ExecutorLoad, ExecutorRecord
from quire.cluster.routing import Candidate, choose_executor, hrw_weight

EXTRA_KEY = "quire-tiny"


def hashes(first_token: int, num_blocks: int) -> list[bytes]:
    return hash_full_blocks([first_token] * (16 * num_blocks), 16, EXTRA_KEY)


def cand(executor_id: str, placed: int = 0, total: int = 100, running: int = 0) -> Candidate:
    load = ExecutorLoad(num_running=running, kv_blocks_total=total)
    record = ExecutorRecord(executor_id, f"{executor_id}:1", 1, "quire-tiny", load)
    return Candidate(record, num_placed_blocks=placed)


def test_working_set_counts_distinct_blocks_per_executor_within_the_window() -> None:
    ws = WorkingSets(window_s=10.0)
    a, b = hashes(1, 3), hashes(2, 2)
    ws.record(a, "ex-a", now=0.0)
    ws.record(a[:2], "ex-a", now=5.0)  # the same blocks again: no new ones
    ws.record(b, "ex-b", now=5.0)
    ws.record(a, "ex-b", now=6.0)  # sent to a second executor: counts there too
    assert (ws.num_blocks("ex-a", 6.0), ws.num_blocks("ex-b", 6.0)) == (3, 5)
    assert ws.is_home("ex-a", a[0], 6.0) and not ws.is_home("ex-a", b[0], 6.0)
    # a[2] was last sent to ex-a at 0.0, a[:2] at 5.0: at 12.0 only the refreshed two remain.
    assert ws.num_blocks("ex-a", 12.0) == 2
    assert ws.num_blocks("ex-a", 16.0) == 0 and not ws.is_home("ex-a", a[0], 16.0)
    assert ws.num_blocks("ex-b", 16.0) == 3  # a, sent at 6.0, is still in the window


def test_working_set_is_bounded_oldest_first_and_off_at_zero() -> None:
    ws = WorkingSets(window_s=100.0, max_entries=4)
    ws.record(hashes(1, 3), "ex-a", now=0.0)
    ws.record(hashes(2, 3), "ex-b", now=1.0)
    assert len(ws) == 4
    assert (ws.num_blocks("ex-a", 1.0), ws.num_blocks("ex-b", 1.0)) == (1, 3)
    off = WorkingSets(window_s=0.0)
    off.record(hashes(1, 3), "ex-a", now=0.0)
    assert len(off) == 0
    with pytest.raises(ValueError):
        WorkingSets(window_s=-1.0)


def test_a_miss_goes_to_the_emptiest_working_set_among_the_least_loaded() -> None:
    h = hashes(7, 2)
    top, other = sorted(["ex-a", "ex-b"], key=lambda e: -hrw_weight(h[0], e))
    # Equal shares: the consistent-hash choice.
    d = choose_executor([cand(top), cand(other)], h, [7] * 32)
    assert d is not None and (d.executor_id, d.reason) == (top, "consistent_hash")
    # The hash's choice holds a larger share of its cache: placement overrides it.
    d = choose_executor([cand(top, placed=60), cand(other, placed=20)], h, [7] * 32)
    assert d is not None and (d.executor_id, d.reason) == (other, "placement")
    # Shares, not counts: 60 of 300 blocks is less than 20 of 50.
    d = choose_executor([cand(top, placed=60, total=300), cand(other, placed=20, total=50)], h, [7])
    assert d is not None and d.executor_id == top
    # Load comes first: the emptier executor is busier, so the miss goes by load.
    d = choose_executor([cand(top, placed=60), cand(other, placed=20, running=1)], h, [7] * 32)
    assert d is not None and (d.executor_id, d.reason) == (top, "consistent_hash")
    # A sibling's executor keeps the prompt even with the fuller working set.
    home = replace(cand(top, placed=60), is_home=True)
    d = choose_executor([home, cand(other, placed=20)], h, [7] * 32)
    assert d is not None and d.executor_id == top


def test_prefix_policy_spreads_new_prefixes_by_working_set() -> None:
    # Three new 4-block prefixes, all of which the hash would send to the same executor: the
    # policy places the first by hash and the next on the emptier executor, and a sibling of
    # the first (a miss still: nobody's prefix set shows it) follows it home.
    policy = PrefixPolicy()
    ids = ["ex-a", "ex-b"]
    prompts: list[list[int]] = []
    token = 0
    while len(prompts) < 2:
        token += 1
        first = hashes(token, 1)[0]
        if max(ids, key=lambda e: hrw_weight(first, e)) == "ex-a":
            prompts.append([token] * 64)
    chosen = []
    for i, p in enumerate(prompts):
        request = RoutingRequest(p, hash_full_blocks(p, 16, EXTRA_KEY), 16, float(i))
        d = policy.choose([cand("ex-a"), cand("ex-b")], request)
        assert d is not None
        chosen.append((d.executor_id, d.reason))
    assert chosen == [("ex-a", "consistent_hash"), ("ex-b", "placement")]
    sibling = prompts[1][:48] + [99] * 16
    request = RoutingRequest(sibling, hash_full_blocks(sibling, 16, EXTRA_KEY), 16, 2.0)
    d = policy.choose([cand("ex-a"), cand("ex-b", placed=0)], request)
    assert d is not None and (d.executor_id, d.reason) == ("ex-b", "placement")
