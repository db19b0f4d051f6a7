"""The oracle hit rate: leading blocks an unlimited cache would hold, in arrival order."""

from __future__ import annotations

from benchmarks.routing.oracle import cached_tokens_per_request, oracle_hit_rate

BS = 4


def test_leading_blocks_of_earlier_prompts_hit() -> None:
    a = list(range(10))  # blocks [0-3], [4-7], partial
    b = list(range(8)) + [99, 98, 97]  # shares both full blocks of a
    c = [0, 1, 2, 3, 50, 51, 52, 53, 4]  # shares the first block only
    d = [7, 7, 7, 7] + list(range(4, 8))  # its second block's tokens match a's, not its chain
    assert cached_tokens_per_request([a, b, c, d], BS, "m") == [0, 8, 4, 0]
    assert oracle_hit_rate([a, b, c, d], BS, "m") == 12 / (10 + 11 + 9 + 8)


def test_a_whole_cached_prompt_still_computes_its_last_token() -> None:
    a = list(range(8))
    # The same 8 tokens again: (8 - 1) // 4 = 1 block at most, as the block manager caps it.
    assert cached_tokens_per_request([a, a, a + [1]], BS, "m") == [0, 4, 8]


def test_a_shorter_prompt_hits_a_longer_one_in_either_order() -> None:
    short, long = list(range(5)), list(range(9))
    assert cached_tokens_per_request([short, long], BS, "m") == [0, 4]
    assert cached_tokens_per_request([long, short], BS, "m") == [0, 4]
    assert oracle_hit_rate([], BS, "m") == 0.0
