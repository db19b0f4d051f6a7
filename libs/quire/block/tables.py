"""Block tables as deltas, and the executor's one record of what the allocator granted.

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
get no update at all. Frees, preemptions and refusals drop tables (a preempted sequence's
last table stays readable as `preempted_tables` until the next step is applied).

Ownership. On the executor side `BlockTables` is the only holder of block tables: the
model runner keeps one next to the KV tensors the tables index and builds slot mappings
from it, the scheduler takes each step through it (`BlockTables.step`, which applies the
result once), and a remote allocator re-registers from it (`live_sequences()`). Beside the
tables it records what the allocator was told of each sequence (token ids, extra key,
tokens committed to the prefix index), so it alone describes the executor's sequences as
the allocator granted them: the state a restarted memory manager is rebuilt from.

Consistency. The executor and the allocator must agree on every table; a lost update
would make the executor write KV where the allocator does not expect it. Two checks:

- always, at no cost on the wire: `start <= len(old)`, and every table the step
  names has exactly ceil(num_tokens / block_size) blocks, the executor counting the
  tokens itself (a lost append or admit is caught in the step it was lost);
- when the request sets `verify_tables`: the result carries `table_checksum()` of the
  full table of every sequence the step names (see `named_seq_ids`), compared with
  the executor's tables after applying the updates.

A failed check raises `TableDriftError` before anything changes. `step()` then asks the
allocator to `resync` (the remote allocator re-registers with `live_sequences()`, as after
a manager restart, and retries the step verified); a second failure is raised.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from quire.block.allocator import BlockAllocator, StepAllocation, StepAllocationResult
from quire.block.restore import LiveSequenceState


class TableDriftError(RuntimeError):
    """The executor's tables and the allocator's disagree (an update was lost or misapplied)."""

    def __init__(self, seq_ids: list[str], detail: str) -> None:
        super().__init__(f"block tables drifted for {seq_ids[:8]!r}: {detail}")
        self.seq_ids = seq_ids
        self.detail = detail


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


@dataclass
class _Granted:
    """One live sequence as the allocator last granted it."""

    token_ids: list[int]  # every token holding a KV slot
    extra_key: str
    table: list[int]  # a new list whenever it changes
    num_committed_tokens: int  # leading tokens whose full blocks are in the prefix index


class BlockTables:
    """The executor's block tables, kept current from each step's result by `apply`.

    Also what the allocator was told of every live sequence (tokens, extra key, commits),
    which gives the always-on length check (after a step, every table the step names has
    exactly ceil(num_tokens / block_size) blocks) and `live_sequences()`.
    """

    def __init__(self, block_size: int, num_groups: int = 1) -> None:
        """`num_groups`: KV groups, each with an entry per logical block of a table
        (quire.block.window.TableLayout)."""
        if block_size < 1:
            raise ValueError(f"block_size: must be >= 1, got {block_size}")
        if num_groups < 1:
            raise ValueError(f"num_groups: must be >= 1, got {num_groups}")
        self.block_size = block_size
        self.num_groups = num_groups
        self._seqs: dict[str, _Granted] = {}
        # The tables of the sequences the last applied step preempted, as they were before
        # it: their blocks still hold the sequences' KV until the step's copies and forward
        # pass run (swap mode reads them out then, quire.engine.swap).
        self.preempted_tables: dict[str, list[int]] = {}

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    def __len__(self) -> int:
        return len(self._seqs)

    def get(self, seq_id: str) -> list[int]:
        """The live table of `seq_id` (a new list whenever it changes; do not mutate)."""
        return self._seqs[seq_id].table

    def num_tokens(self, seq_id: str) -> int:
        """Tokens of `seq_id` holding a KV slot, as the allocator was told of them (0 for a
        sequence the allocator does not hold)."""
        seq = self._seqs.get(seq_id)
        return len(seq.token_ids) if seq is not None else 0

    def free_slots(self, seq_id: str) -> int:
        """KV slots of `seq_id`'s table after its tokens (the rest of its last block, in each
        KV group): where its next tokens go without a new block."""
        logical_blocks = len(self.get(seq_id)) // self.num_groups
        return logical_blocks * self.block_size - self.num_tokens(seq_id)

    def num_committed_tokens(self, seq_id: str) -> int:
        """Tokens of `seq_id` whose full blocks the allocator has in its prefix index (prefix
        hits and commits sent); 0 for a sequence the allocator does not hold."""
        seq = self._seqs.get(seq_id)
        return seq.num_committed_tokens if seq is not None else 0

    def live_sequences(self) -> list[LiveSequenceState]:
        """Every live sequence as the allocator last granted it (what re-registration sends)."""
        return [
            LiveSequenceState(
                seq_id=seq_id,
                token_ids=tuple(seq.token_ids),
                block_table=tuple(seq.table),
                num_computed_tokens=seq.num_committed_tokens,
                extra_key=seq.extra_key,
            )
            for seq_id, seq in self._seqs.items()
        ]

    def reset(self, live: Iterable[LiveSequenceState]) -> None:
        """Replace every sequence with `live` (an allocator rebuilt from exactly these)."""
        self._seqs = {
            state.seq_id: _Granted(
                list(state.token_ids),
                state.extra_key,
                list(state.block_table),
                state.num_computed_tokens,
            )
            for state in live
        }

    def step(self, allocator: BlockAllocator, request: StepAllocation) -> StepAllocationResult:
        """One allocator step, its result applied here once.

        On drift the allocator is asked to `resync` (rebuild its view from these tables
        and redo the step verified); drift again raises `TableDriftError`.
        """
        result = allocator.step(request)
        try:
            self.apply(request, result)
        except TableDriftError as exc:
            request = replace(request, verify_tables=True)
            result = allocator.resync(request, str(exc))
            try:
                self.apply(request, result)
            except TableDriftError as again:
                raise TableDriftError(
                    again.seq_ids, f"again after a resync: {again.detail}"
                ) from again
        return result

    def apply(self, request: StepAllocation, result: StepAllocationResult) -> None:
        """Apply one step's result: drop freed/preempted sequences, apply updates, check.

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
            known = None if fresh else self._seqs.get(seq_id)
            if known is None and update.start:
                raise TableDriftError([seq_id], f"update at {update.start} of an unknown table")
            if known is not None and update.start > len(known.table):
                raise TableDriftError(
                    [seq_id],
                    f"update starts at {update.start}, table has {len(known.table)} blocks",
                )
            old = known.table[: update.start] if known is not None else []
            staged[seq_id] = old + list(update.block_ids)
        named = list(named_seq_ids(request, result))
        bad = []
        for seq_id in named:
            table = staged.get(seq_id)
            if table is None and seq_id in self._seqs:
                table = self._seqs[seq_id].table
            expected = self.num_groups * -(num_tokens[seq_id] // -self.block_size)
            if table is None or len(table) != expected:
                bad.append(seq_id)
        if bad:
            raise TableDriftError(bad, "table length does not match the token count")
        if result.table_checksums:
            self._verify(staged, result.table_checksums)
        self._commit_step(request, result, staged, gone)

    def _commit_step(
        self,
        request: StepAllocation,
        result: StepAllocationResult,
        staged: dict[str, list[int]],
        gone: set[str],
    ) -> None:
        """The checked step's changes, in the allocator's processing order."""
        seqs = self._seqs
        for fork in request.forks:
            parent = seqs[fork.parent_seq_id]
            seqs[fork.child_seq_id] = _Granted(
                list(parent.token_ids),
                parent.extra_key,
                parent.table,
                parent.num_committed_tokens,
            )
        for commit in request.commits:
            seq = seqs.get(commit.seq_id)
            if seq is not None:
                seq.num_committed_tokens = max(seq.num_committed_tokens, commit.num_computed_tokens)
        self.preempted_tables = {
            seq_id: seqs[seq_id].table for seq_id in result.preempted if seq_id in seqs
        }
        for seq_id in gone:
            seqs.pop(seq_id, None)
        for append in request.appends:
            if append.seq_id in seqs:
                seqs[append.seq_id].token_ids.extend(append.token_ids)
        refused = set(result.not_admitted)
        for admit in request.admits:
            if admit.seq_id not in refused:
                seqs[admit.seq_id] = _Granted(
                    list(admit.token_ids),
                    admit.extra_key,
                    [],
                    result.num_cached_tokens.get(admit.seq_id, 0),
                )
        for seq_id, table in staged.items():
            if seq_id in seqs:
                seqs[seq_id].table = table

    def _tokens(self, seq_id: str, staged: dict[str, int]) -> int:
        if seq_id in staged:
            return staged[seq_id]
        if seq_id not in self._seqs:
            raise TableDriftError([seq_id], "the step names a sequence this copy does not hold")
        return len(self._seqs[seq_id].token_ids)

    def _verify(self, staged: dict[str, list[int]], checksums: dict[str, int]) -> None:
        bad = []
        for seq_id, checksum in checksums.items():
            table = staged.get(seq_id)
            if table is None and seq_id in self._seqs:
                table = self._seqs[seq_id].table
            if table is None or table_checksum(table) != checksum:
                bad.append(seq_id)
        if bad:
            raise TableDriftError(bad, "checksum mismatch")
