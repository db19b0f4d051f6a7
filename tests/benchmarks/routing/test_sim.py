"""The executor model behind the simulation: service times, LRU caches, the real policies."""

from __future__ import annotations

import pytest

from benchmarks.routing_sim.model import Rates, SimExecutor, SimRequest, simulate
from quire.cluster.policies import make_policy

RATES = Rates(prefill_tok_s=100.0, decode_base_s=0.01, decode_per_seq_s=0.0)


def test_one_request_takes_prefill_then_decode_steps() -> None:
    r = simulate(make_policy("round-robin"), [SimRequest([1] * 50, 3, 0.0)], 1, RATES, 100)
    # 50 tokens at 100 tok/s, first token at the end of that step; then 2 decode steps.
    assert r.ttft == [pytest.approx(0.5)]
    assert r.e2e == [pytest.approx(0.52)]
    assert r.cached_tokens == 0


def test_prefix_policy_follows_the_cache_and_round_robin_does_not() -> None:
    prompt = list(range(64))
    turn2 = prompt + list(range(100, 132))
    reqs = [SimRequest(prompt, 2, 0.0), SimRequest(turn2, 2, 10.0, after=0)]
    prefix = simulate(make_policy("prefix"), reqs, 2, RATES, 100)
    assert (
        prefix.cached_tokens == 64
        and prefix.requests_per_executor == {"executor-00": 2}
        or (prefix.requests_per_executor == {"executor-01": 2})
    )
    rr = simulate(make_policy("round-robin"), reqs, 2, RATES, 100)
    assert rr.cached_tokens == 0
    assert rr.requests_per_executor == {"executor-00": 1, "executor-01": 1}
    # The hit skips 64 of 96 prefill tokens.
    assert prefix.ttft[1] == pytest.approx(0.32)
    assert rr.ttft[1] == pytest.approx(0.96)


def test_lru_cache_evicts_the_oldest_block() -> None:
    ex = SimExecutor("executor-00", cache_blocks=2)
    ex.touch([b"a", b"b"])
    ex.touch([b"a"])  # a is now the newest
    ex.touch([b"c"])
    assert list(ex.cache) == [b"a", b"c"]
    assert ex.cached_blocks([b"a", b"c", b"b"], 3) == 2
    assert ex.cached_blocks([b"b", b"a"], 2) == 0


def test_a_peers_blocks_are_pulled_at_the_pull_rate() -> None:
    rates = Rates(
        prefill_tok_s=100.0, decode_base_s=0.01, decode_per_seq_s=0.0, pull_s_per_token=0.001
    )
    prompt = list(range(64))
    turn2 = prompt + list(range(100, 132))
    reqs = [SimRequest(prompt, 1, 0.0), SimRequest(turn2, 1, 10.0, after=0)]
    # Round-robin sends the second turn to executor-01, which holds nothing of it.
    off = simulate(make_policy("round-robin"), reqs, 2, rates, 100)
    on = simulate(make_policy("round-robin"), reqs, 2, rates, 100, pulls=True)
    assert (
        off.requests_per_executor
        == on.requests_per_executor
        == {"executor-00": 1, "executor-01": 1}
    )
    assert (off.cached_tokens, off.pulled_tokens) == (0, 0)
    assert (on.cached_tokens, on.pulled_tokens) == (64, 64)  # pulled tokens count as cached
    assert off.ttft[1] == pytest.approx(0.96)
    # 64 tokens pulled at 1 ms each, then the 32 new ones computed at 100 tok/s.
    assert on.ttft[1] == pytest.approx(0.064 + 0.32)


def test_only_what_the_destination_lacks_is_pulled() -> None:
    rates = Rates(
        prefill_tok_s=100.0, decode_base_s=0.01, decode_per_seq_s=0.0, pull_s_per_token=0.001
    )
    prompt = list(range(64))
    reqs = [SimRequest(prompt, 1, 0.0), SimRequest(prompt + [7] * 16, 1, 10.0, after=0)]
    # One executor: the second request's 64 tokens are its own hit, nothing to pull.
    r = simulate(make_policy("round-robin"), reqs, 1, rates, 100, pulls=True)
    assert (r.cached_tokens, r.pulled_tokens) == (64, 0)
    assert r.ttft[1] == pytest.approx(0.16)
