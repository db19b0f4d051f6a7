"""Block tables as deltas: what a step changed, applied to the executor's copy.

A step's result does not carry whole block tables. For every sequence whose table
changed it carries a `TableUpdate`: keep the first `start` entries of the table the
executor already holds and put `block_ids` after them. That covers every change an
allocator makes in one step:

- a decode step that crosses a block boundary: `start == len(old)`, one new id;
- copy-on-write of a shared partial last block: `start == len(old) - 1`, the copy's
  id first (then any new blocks);
- a new table (admitted prompt, prefix hit or not; a child forked this step):
  `start == 0`, the whole table.

Sequences whose table did not change (most decode steps: 15 of 16 at block size 16)
get no update at all. Frees, preemptions and refusals drop tables.

Consistency. The executor and the allocator must agree on every table; a lost update
would make the executor write KV where the allocator does not expect it. Two checks:

- always, at no cost on the wire: `start <= len(old)`, and every table the step
  names has exactly ceil(num_tokens / block_size) blocks, the executor counting the
  tokens itself (a lost append or admit is caught in the step it was lost);
- when the request sets `verify_tables`: the result carries `table_checksum()` of the
  full table of every sequence the step names (see `named_seq_ids`), compared with
  the executor's tables after applying the updates.

A failed check raises `TableDriftError` before the executor's tables change, so the
caller can rebuild the allocator's view from its own (the remote allocator
re-registers with its live sequences, as after a manager restart, and retries).
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable, Iterator

from quire.block.allocator import StepAllocation, StepAllocationResult


class TableDriftError(RuntimeError):
    """The executor's tables and the allocator's disagree (an update was lost or misapplied)."""

    def __init__(self, seq_ids: list[str], detail: str) -> None:
        super().__init__(f"block tables drifted for {seq_ids[:8]!r}: {detail}")
        self.seq_ids = seq_ids


def table_checksum(table: Iterable[int]) -> int:
    """CRC-32 of the table as little-endian uint32s (the same on every host and language)."""
    data = array("I", table)
    if data.itemsize != 4:  # pragma: no cover (no supported platform)
        data = array("L", data)
    return zlib.crc32(data.tobytes())


def named_seq_ids(request: StepAllocation, result: StepAllocationResult) -> Iterator[str]:
    """Every sequence the step leaves live and names: fork children, appends, admits.

    The sequences a verified step carries checksums for (and the pre-delta protocol
    carried full tables for), in request order.
    """
    gone = set(request.frees) | set(result.preempted)
    for fork in request.forks:
        if fork.child_seq_id not in gone:
            yield fork.child_seq_id
    for append in request.appends:
        if append.seq_id not in gone:
            yield append.seq_id
    refused = set(result.not_admitted)
    for admit in request.admits:
        if admit.seq_id not in refused:
            yield admit.seq_id


class BlockTables:
    """The executor's copy of its sequences' block tables, kept current by `apply`.

    It also counts each sequence's tokens (from the requests), which gives the
    always-on length check: after a step, every table the step names must have
    exactly ceil(num_tokens / block_size) blocks.
    """

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size: must be >= 1, got {block_size}")
        self.block_size = block_size
        self._tables: dict[str, list[int]] = {}
        self._num_tokens: dict[str, int] = {}

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._tables

    def __len__(self) -> int:
        return len(self._tables)

    def get(self, seq_id: str) -> list[int]:
        """The live table of `seq_id` (a new list whenever it changes; do not mutate)."""
        return self._tables[seq_id]

    def reset(self, tables: dict[str, tuple[list[int], int]]) -> None:
        """Replace every table: seq_id -> (table, num_tokens) (after re-registering, the
        allocator was rebuilt from exactly these)."""
        self._tables = {seq_id: list(table) for seq_id, (table, _) in tables.items()}
        self._num_tokens = {seq_id: num for seq_id, (_, num) in tables.items()}

    def apply(self, request: StepAllocation, result: StepAllocationResult) -> None:
        """Apply one step's result: drop freed/preempted tables, apply updates, check.

        Raises `TableDriftError`, changing nothing, if an update starts past the end of
        the table it updates, a table the step names has the wrong length for its
        tokens, or a checksum the result carries does not match.
        """
        gone = set(request.frees) | set(result.preempted)
        num_tokens: dict[str, int] = {}
        for fork in request.forks:
            num_tokens[fork.child_seq_id] = self._tokens(fork.parent_seq_id, num_tokens)
        for append in request.appends:
            num_tokens[append.seq_id] = self._tokens(append.seq_id, num_tokens) + len(
                append.token_ids
            )
        for admit in request.admits:
            num_tokens[admit.seq_id] = len(admit.token_ids)
        forked = {fork.child_seq_id for fork in request.forks}
        staged: dict[str, list[int]] = {}
        for seq_id, update in result.table_updates.items():
            fresh = seq_id in forked or seq_id in gone or update.start == 0
            old = None if fresh else self._tables.get(seq_id)
            if old is None and update.start:
                raise TableDriftError([seq_id], f"update at {update.start} of an unknown table")
            if old is not None and update.start > len(old):
                raise TableDriftError(
                    [seq_id], f"update starts at {update.start}, table has {len(old)} blocks"
                )
            staged[seq_id] = (old[: update.start] if old else []) + list(update.block_ids)
        named = list(named_seq_ids(request, result))
        bad = []
        for seq_id in named:
            table = staged.get(seq_id, self._tables.get(seq_id))
            if table is None or len(table) != -(num_tokens[seq_id] // -self.block_size):
                bad.append(seq_id)
        if bad:
            raise TableDriftError(bad, "table length does not match the token count")
        if result.table_checksums:
            self._verify(staged, result.table_checksums)
        for seq_id in gone:
            self._tables.pop(seq_id, None)
            self._num_tokens.pop(seq_id, None)
        self._tables.update(staged)
        for seq_id in named:
            self._num_tokens[seq_id] = num_tokens[seq_id]

    def _tokens(self, seq_id: str, staged: dict[str, int]) -> int:
        if seq_id in staged:
            return staged[seq_id]
        if seq_id not in self._num_tokens:
            raise TableDriftError([seq_id], "the step names a sequence this copy does not hold")
        return self._num_tokens[seq_id]

    def _verify(self, staged: dict[str, list[int]], checksums: dict[str, int]) -> None:
        bad = []
        for seq_id, checksum in checksums.items():
            table = staged.get(seq_id, self._tables.get(seq_id))
            if table is None or table_checksum(table) != checksum:
                bad.append(seq_id)
        if bad:
            raise TableDriftError(bad, "checksum mismatch")
