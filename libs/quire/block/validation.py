"""Whole-request validation for `StepAllocation`, run before any state changes.

A step is applied field by field (forks, commits, frees, appends, admits), so a
sequence id's liveness depends on the fields before it: a child forked in this
step can be committed, freed or appended to, a freed sequence cannot be
appended to, a freed id can be admitted again. Checking everything up front
means a bad request raises ValueError and leaves the allocator exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable

from quire.block.allocator import StepAllocation
from quire.block.hashing import check_token_ids


def validate_step(request: StepAllocation, num_tokens_of: Callable[[str], int | None]) -> None:
    """Raise ValueError (naming the field and seq id) if `request` is malformed.

    `num_tokens_of(seq_id)` returns a live sequence's token count, None if unknown.
    """
    forked: dict[str, int] = {}  # child seq id -> token count
    freed: set[str] = set()
    deferred: dict[str, int] = {}  # seq id -> tokens its deferred append adds

    def tokens_if_live(seq_id: str) -> int | None:
        if seq_id in freed:
            return None
        if seq_id in forked:
            return forked[seq_id]
        num_tokens = num_tokens_of(seq_id)
        return None if num_tokens is None else num_tokens + deferred.get(seq_id, 0)

    for append in request.deferred_appends:
        if tokens_if_live(append.seq_id) is None:
            raise ValueError(f"deferred_appends: unknown seq_id {append.seq_id!r}")
        if append.seq_id in deferred:
            raise ValueError(f"deferred_appends: seq_id {append.seq_id!r} listed twice")
        check_token_ids(append.token_ids, f"deferred_appends: seq_id {append.seq_id!r}")
        deferred[append.seq_id] = len(append.token_ids)

    for fork in request.forks:
        parent_tokens = tokens_if_live(fork.parent_seq_id)
        if parent_tokens is None:
            raise ValueError(f"forks: unknown parent_seq_id {fork.parent_seq_id!r}")
        if tokens_if_live(fork.child_seq_id) is not None:
            raise ValueError(f"forks: child_seq_id {fork.child_seq_id!r} already exists")
        forked[fork.child_seq_id] = parent_tokens

    committed: set[str] = set()
    for commit in request.commits:
        num_tokens = tokens_if_live(commit.seq_id)
        if num_tokens is None:
            raise ValueError(f"commits: unknown seq_id {commit.seq_id!r}")
        if commit.seq_id in committed:
            raise ValueError(f"commits: seq_id {commit.seq_id!r} listed twice")
        committed.add(commit.seq_id)
        count = commit.num_computed_tokens
        if not isinstance(count, int) or not 0 <= count <= num_tokens:
            raise ValueError(
                f"commits: num_computed_tokens {count!r} of seq_id {commit.seq_id!r} "
                f"is not in [0, {num_tokens}]"
            )

    for seq_id in request.frees:
        if seq_id in freed:
            raise ValueError(f"frees: seq_id {seq_id!r} listed twice")
        if tokens_if_live(seq_id) is None:
            raise ValueError(f"frees: unknown seq_id {seq_id!r}")
        freed.add(seq_id)

    appended: set[str] = set()
    for append in request.appends:
        if tokens_if_live(append.seq_id) is None:
            raise ValueError(f"appends: unknown seq_id {append.seq_id!r}")
        if append.seq_id in appended:
            raise ValueError(f"appends: seq_id {append.seq_id!r} listed twice")
        appended.add(append.seq_id)
        check_token_ids(append.token_ids, f"appends: seq_id {append.seq_id!r}")

    admitted: set[str] = set()
    for admit in request.admits:
        if tokens_if_live(admit.seq_id) is not None:
            raise ValueError(f"admits: seq_id {admit.seq_id!r} is already live")
        if admit.seq_id in admitted:
            raise ValueError(f"admits: seq_id {admit.seq_id!r} listed twice")
        admitted.add(admit.seq_id)
        if not admit.token_ids:
            raise ValueError(f"admits: seq_id {admit.seq_id!r} has no token_ids")
        if not isinstance(admit.extra_key, str):
            raise ValueError(f"admits: extra_key of seq_id {admit.seq_id!r} is not a str")
        check_token_ids(admit.token_ids, f"admits: seq_id {admit.seq_id!r}")
