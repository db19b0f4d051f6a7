"""Hash parameters from executor records, and the rule when executors disagree."""

from __future__ import annotations

import pytest

from quire.cluster.hash_params import HashParams, resolve_hash_params
from quire.cluster.redis_keys import ExecutorRecord

FALLBACK = HashParams(16, "router-model")


def record(executor_id: str, block_size: int | None, extra_key: str | None) -> ExecutorRecord:
    return ExecutorRecord(executor_id, "-", 1, "m", block_size=block_size, hash_extra_key=extra_key)


def test_records_announcing_nothing_use_the_fallback() -> None:
    a = resolve_hash_params([record("ex-a", None, None), record("ex-b", None, None)], FALLBACK)
    assert (a.params, a.source, a.is_mismatch) == (FALLBACK, "fallback", False)
    assert a.agreeing == {"ex-a", "ex-b"}


def test_announced_params_override_the_fallback() -> None:
    a = resolve_hash_params([record("ex-a", 32, "smollm"), record("ex-b", 32, "smollm")], FALLBACK)
    assert (a.params, a.source, a.is_mismatch) == (HashParams(32, "smollm"), "executors", False)
    assert a.disagreeing == ()


def test_disagreement_majority_wins_and_is_reported() -> None:
    records = [record("ex-a", 16, "m"), record("ex-b", 32, "m"), record("ex-c", 32, "m")]
    a = resolve_hash_params(records, FALLBACK)
    assert a.is_mismatch and a.params == HashParams(32, "m")
    assert a.disagreeing == ("ex-a",) and a.agreeing == {"ex-b", "ex-c"}
    assert a.groups == ((HashParams(16, "m"), ("ex-a",)), (HashParams(32, "m"), ("ex-b", "ex-c")))


def test_disagreement_tie_goes_to_the_group_of_the_smallest_id() -> None:
    a = resolve_hash_params([record("ex-b", 16, "m"), record("ex-a", 16, "other")], FALLBACK)
    assert a.is_mismatch and a.params == HashParams(16, "other") and a.disagreeing == ("ex-b",)


def test_a_silent_record_counts_with_the_fallback() -> None:
    # An old executor (no announcement) hashes like the router's flags: a mismatch when the
    # announcing one says otherwise.
    a = resolve_hash_params([record("ex-a", None, None), record("ex-b", 16, "real")], FALLBACK)
    assert a.is_mismatch and a.params == FALLBACK  # tie, ex-a's group


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        HashParams(0, "m")
