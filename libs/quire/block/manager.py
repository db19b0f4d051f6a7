"""BlockManager: the in-process `BlockAllocator` (block tables, prefix cache, CoW, preemption).

One `step()` applies a whole `StepAllocation` in the contract's order (see
quire.block.allocator): forks, commits, frees, appends (preempting from the end
of the appends list when the pool runs dry), then FCFS admits, skipped entirely
when anything was preempted. The request is validated as a whole first, so a
malformed one raises ValueError and changes nothing.

With a `sliding_window` (every layer of the model slides through it), a commit of c
computed tokens also releases the sequence's table entries below the first block a later
token can read (quire.block.window): their slots hold `RELEASED_BLOCK`, one `TableUpdate`
from the first released slot tells the caller, and full blocks stay cached by hash. With a
`layout` of several KV groups (a hybrid model), each sequence's flat table holds one entry
per group per logical block, and only the sliding groups' entries are released; a prefix hit
needs every group's block of each logical block it covers (group g's indexed under
`group_block_hash(hash, g)`).

For a memory-manager service: `restore()` rebuilds an empty manager from an
executor's live sequences (see quire.block.restore), and `drain_index_events()`
reports what entered and left the prefix index since the last call, for mirroring
it into Redis.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from quire.block.allocator import (
    AdmitRequest,
    AllocatorStats,
    AppendRequest,
    CommitRequest,
    ForkRequest,
    StepAllocation,
    StepAllocationResult,
    TableUpdate,
)
from quire.block.appends import AppendPhase, Touched
from quire.block.hashing import extend_block_hashes, group_block_hash
from quire.block.pool import BlockPool
from quire.block.restore import LiveSequenceState, validate_live_sequences
from quire.block.sequence_state import SequenceState, cdiv
from quire.block.tables import named_seq_ids, table_checksum
from quire.block.validation import validate_step
from quire.block.window import RELEASED_BLOCK, TableLayout, first_needed_block


class BlockManager:
    """Paged KV block tables over a `BlockPool`, with prefix caching and copy-on-write."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        sliding_window: int | None = None,
        layout: TableLayout | None = None,
    ) -> None:
        """`sliding_window`: every layer's window (one group); `layout`: the KV groups of a
        hybrid model instead (not both)."""
        if block_size < 1:
            raise ValueError(f"block_size: must be >= 1, got {block_size}")
        if layout is not None and sliding_window is not None:
            raise ValueError("pass sliding_window or layout, not both")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.layout = layout if layout is not None else TableLayout.of(sliding_window)
        self.num_groups = self.layout.num_groups
        # The sliding groups' window in tokens: their blocks before a sequence's window are
        # released on commit. None: every block of a sequence is kept while it runs.
        self.sliding_window = self.layout.sliding_window
        self.pool = BlockPool(num_blocks)
        self._seqs: dict[str, SequenceState] = {}
        self._num_queries = 0
        self._num_hits = 0
        self._num_copies = 0
        self._num_preemptions = 0
        # block id -> references held by pins (blocks a peer is copying; see `pin`)
        self._pinned: Counter[int] = Counter()

    # ---------------------------------------------------------------- queries

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def has_seq(self, seq_id: str) -> bool:
        return seq_id in self._seqs

    def seq_ids(self) -> list[str]:
        """Every live sequence, in the order it entered the pool."""
        return list(self._seqs)

    def block_table(self, seq_id: str) -> list[int]:
        """A copy of the live sequence's block table."""
        return list(self._get(seq_id, "seq_id").block_table)

    def live_sequences(self) -> list[LiveSequenceState]:
        """Every live sequence as this manager holds it, in pool order (what `restore`
        takes; computed tokens counted as those of the blocks registered in the index)."""
        return [
            LiveSequenceState(
                seq_id=seq_id,
                token_ids=tuple(seq.token_ids),
                block_table=tuple(seq.block_table),
                num_computed_tokens=seq.num_registered_blocks * self.block_size,
                extra_key=seq.extra_key,
            )
            for seq_id, seq in self._seqs.items()
        ]

    def num_tokens(self, seq_id: str) -> int:
        return len(self._get(seq_id, "seq_id").token_ids)

    def stats(self) -> AllocatorStats:
        """Block counts now and cumulative counters (prefix-cache figures in tokens)."""
        return AllocatorStats(
            num_blocks_total=self.num_blocks,
            num_blocks_used=self.pool.num_used_blocks,
            num_blocks_cached=self.pool.num_cached_blocks,
            num_blocks_shared=self.pool.num_shared_blocks,
            prefix_cache_queries=self._num_queries,
            prefix_cache_hits=self._num_hits,
            num_copies=self._num_copies,
            num_preemptions=self._num_preemptions,
        )

    def block_states(self) -> bytes:
        """One `quire.block.pool.BlockState` byte per physical block (free, used, cached, shared)."""
        return self.pool.block_states()

    def indexed_hashes(self) -> list[bytes]:
        """Every block hash in the prefix index (used or cached blocks)."""
        return self.pool.indexed_hashes()

    def drain_index_events(self) -> tuple[list[bytes], list[bytes]]:
        """(added, removed) prefix-index hashes since the last call; cleared on read.

        The net change: `added` were newly indexed (a commit or restore registered
        them), `removed` were evicted (their cached block was reused). The lists
        are disjoint; see `BlockPool.drain_index_events`.
        """
        return self.pool.drain_index_events()

    # ---------------------------------------------------------------- restore

    def restore(self, live: list[LiveSequenceState]) -> None:
        """Rebuild state on an EMPTY manager from an executor's live sequences.

        Refcounts become the number of tables referencing each block, every other
        block is free (in id order), and with prefix caching the hashes of each
        sequence's full computed blocks are registered (first in `live` wins).
        Raises ValueError, changing nothing, if the manager is not empty or `live`
        is inconsistent (see quire.block.restore).
        """
        if self._seqs or self.pool.num_used_blocks or self.pool.indexed_hashes():
            raise ValueError("restore: the manager is not empty")
        all_hashes = validate_live_sequences(live, self.num_blocks, self.block_size, self.layout)
        for state, hashes in zip(live, all_hashes, strict=True):
            num_registered = 0
            if self.enable_prefix_caching:
                num_registered = state.num_computed_tokens // self.block_size
            seq = SequenceState(
                token_ids=list(state.token_ids),
                extra_key=state.extra_key,
                block_table=list(state.block_table),
                block_hashes=hashes if self.enable_prefix_caching else [],
                num_registered_blocks=num_registered,
                num_released_blocks=self.layout.num_released(
                    state.block_table, len(state.token_ids), self.block_size
                ),
            )
            for block_id in seq.present_blocks():
                self.pool.touch(block_id)
            self._register_entries(seq, 0, num_registered)
            self._seqs[state.seq_id] = seq

    # ------------------------------------------------------------------- step

    def step(self, request: StepAllocation) -> StepAllocationResult:
        """Apply one engine step's forks, commits, frees, appends and admits, in that order."""
        validate_step(request, self._num_tokens_or_none)
        self._check_deferred(request.deferred_appends)
        for append in request.deferred_appends:
            self._seqs[append.seq_id].token_ids.extend(append.token_ids)
        result = StepAllocationResult()
        touched: Touched = {}
        for fork in request.forks:
            self._fork(fork)
            touched[fork.child_seq_id] = None
        released: dict[str, int] = {}  # seq_id -> its first slot released this step
        for commit in request.commits:
            self._commit(commit, released)
        for seq_id in request.frees:
            self._release_seq(seq_id)
        AppendPhase(self.pool, self._seqs, self.block_size, result, touched, self.num_groups).run(
            request.appends
        )
        self._num_copies += len(result.copies)
        self._num_preemptions += len(result.preempted)
        if result.preempted:
            # Preempted work goes back to the queue first: no admits this step.
            result.not_admitted = [admit.seq_id for admit in request.admits]
        else:
            for index, admit in enumerate(request.admits):
                if not self._admit(admit, result):
                    result.not_admitted = [a.seq_id for a in request.admits[index:]]
                    break
                touched[admit.seq_id] = None
        self._record_tables(request, result, touched, released)
        return result

    def _check_deferred(self, appends: tuple[AppendRequest, ...]) -> None:
        """Raise ValueError, changing nothing, unless every deferred append fits in its
        sequence's partial last block and that block is the sequence's alone (step 0b)."""
        for append in appends:
            if not append.token_ids:
                continue
            seq = self._seqs[append.seq_id]
            num_tokens = len(seq.token_ids)
            room = cdiv(num_tokens, self.block_size) * self.block_size - num_tokens
            if num_tokens == 0 or len(append.token_ids) > room:
                raise ValueError(
                    f"deferred_appends: {len(append.token_ids)} tokens of seq_id "
                    f"{append.seq_id!r} do not fit in its last block ({room} slots left)"
                )
            last = seq.block_table[-self.num_groups :]
            if any(b == RELEASED_BLOCK or self.pool.refcount(b) != 1 for b in last):
                raise ValueError(
                    f"deferred_appends: the last block of seq_id {append.seq_id!r} is shared "
                    "or released (a deferred append never copies)"
                )

    def resync(self, request: StepAllocation, reason: str) -> StepAllocationResult:
        """Never needed: the caller's tables are built from this manager's own results in
        the same process, so a disagreement is a bug, raised as such."""
        raise RuntimeError(f"block tables disagree with the in-process allocator: {reason}")

    def _record_tables(
        self,
        request: StepAllocation,
        result: StepAllocationResult,
        touched: Touched,
        released: dict[str, int],
    ) -> None:
        """The step's table updates (and, if asked, the checksums of the named tables)."""
        for seq_id in {**touched, **released}:
            seq = self._seqs.get(seq_id)
            if seq is None:
                continue  # freed or preempted after it was touched
            table = seq.block_table
            before = touched.get(seq_id, (len(table), tuple(table[-self.num_groups :])))
            if before is None:
                result.table_updates[seq_id] = TableUpdate(0, tuple(table))
                continue
            # Appends change at most the last logical block's entries (copy-on-write) and
            # add entries after them; a commit may release slots from `released[seq_id]` on.
            old_len, old_last = before
            start = old_len - len(old_last)
            while start < old_len and table[start] == old_last[start - old_len + len(old_last)]:
                start += 1
            start = min(start, released.get(seq_id, start))
            if start < len(table):
                result.table_updates[seq_id] = TableUpdate(start, tuple(table[start:]))
        if request.verify_tables:
            for seq_id in named_seq_ids(request, result):
                result.table_checksums[seq_id] = table_checksum(self._seqs[seq_id].block_table)

    def _release_seq(self, seq_id: str) -> None:
        self.pool.release_tail_first(self._seqs.pop(seq_id).present_blocks())

    def _commit(self, commit: CommitRequest, released: dict[str, int]) -> None:
        seq = self._seqs[commit.seq_id]
        if self.enable_prefix_caching:
            self._register(seq, commit.num_computed_tokens // self.block_size)
        if self.sliding_window is not None:
            self._release_outside_window(commit, seq, released)

    def _register(self, seq: SequenceState, num_full: int) -> None:
        if num_full <= seq.num_registered_blocks:
            return
        extend_block_hashes(seq.block_hashes, seq.token_ids, self.block_size, seq.extra_key)
        self._register_entries(seq, seq.num_registered_blocks, num_full)
        seq.num_registered_blocks = num_full

    def _register_entries(self, seq: SequenceState, first: int, end: int) -> None:
        """Index every group's block of logical blocks first .. end - 1 under its hash (a
        released block keeps the hash it was registered with)."""
        groups = self.num_groups
        for block in range(first, end):
            for group in range(groups):
                block_id = seq.block_table[block * groups + group]
                if block_id != RELEASED_BLOCK:
                    block_hash = group_block_hash(seq.block_hashes[block], group)
                    self.pool.register(block_id, block_hash)

    def _release_outside_window(
        self, commit: CommitRequest, seq: SequenceState, released: dict[str, int]
    ) -> None:
        """Release the sliding groups' blocks no token after the committed ones reads
        (registered ones stay cached), latest first: the leading blocks a prefix hit needs
        are evicted last."""
        assert self.sliding_window is not None
        end = first_needed_block(commit.num_computed_tokens, self.sliding_window, self.block_size)
        start = seq.num_released_blocks
        if end <= start:
            return
        slots = self.layout.released_slots(start, end)
        for index in slots:
            self.pool.release(seq.block_table[index])
            seq.block_table[index] = RELEASED_BLOCK
        seq.num_released_blocks = end
        released.setdefault(commit.seq_id, min(slots))

    def _fork(self, fork: ForkRequest) -> None:
        child = self._seqs[fork.parent_seq_id].fork()
        for block_id in child.present_blocks():
            self.pool.touch(block_id)
        self._seqs[fork.child_seq_id] = child

    # ----------------------------------------------------------------- admits

    def _admit(self, admit: AdmitRequest, result: StepAllocationResult) -> bool:
        """Admit one prompt, or change nothing and return False if it does not fit."""
        token_ids = list(admit.token_ids)
        block_hashes: list[bytes] = []
        hit_blocks: list[int] = []  # flat entries of the hit's logical blocks
        num_released = 0  # leading logical blocks whose sliding entries the hit leaves out
        if self.enable_prefix_caching:
            extend_block_hashes(block_hashes, token_ids, self.block_size, admit.extra_key)
            # At least the last token is recomputed: its logits start decoding.
            max_hit_blocks = (len(token_ids) - 1) // self.block_size
            if admit.skip_prefix_cache:
                max_hit_blocks = 0
            hit_blocks, num_released = self._prefix_hit(block_hashes[:max_hit_blocks])
        present = [block_id for block_id in hit_blocks if block_id != RELEASED_BLOCK]
        num_fresh = self.layout.table_len(len(token_ids), self.block_size) - len(hit_blocks)
        num_hits_free = sum(1 for block_id in present if self.pool.is_free(block_id))
        if num_hits_free + num_fresh > self.pool.num_free_blocks:
            return False

        for block_id in present:
            self.pool.touch(block_id)
        seq = SequenceState(
            token_ids=token_ids,
            extra_key=admit.extra_key,
            block_table=hit_blocks + [self._allocate() for _ in range(num_fresh)],
            block_hashes=block_hashes,
            num_registered_blocks=len(hit_blocks) // self.num_groups,
            num_released_blocks=num_released,
        )
        self._seqs[admit.seq_id] = seq
        num_cached = len(hit_blocks) // self.num_groups * self.block_size
        if self.enable_prefix_caching:
            self._num_queries += len(token_ids)
            self._num_hits += num_cached
        result.num_cached_tokens[admit.seq_id] = num_cached
        return True

    def _prefix_hit(self, block_hashes: Sequence[bytes]) -> tuple[list[int], int]:
        """The longest prefix of the logical blocks `block_hashes` a prompt can take from the
        index, as flat table entries, and the leading logical blocks whose sliding entries it
        leaves out (`RELEASED_BLOCK`).

        A hit of L blocks is computed up to token L * block_size: the global groups need all
        L blocks, a sliding group only those from the block of the next token's window on
        (`first_needed_block`), so a sliding block evicted before that does not cut the hit
        short (vLLM's sliding-window manager's rule)."""
        groups, bs, window = self.num_groups, self.block_size, self.sliding_window
        sliding = self.layout.sliding_groups
        found: list[list[int | None]] = []
        for block_hash in block_hashes:
            ids = [self.pool.lookup(group_block_hash(block_hash, g)) for g in range(groups)]
            if any(ids[g] is None for g in range(groups) if g not in sliding):
                break
            found.append(ids)
        # runs[j]: how many logical blocks up to j in a row have every sliding entry indexed
        runs: list[int] = []
        for ids in found:
            whole = all(ids[g] is not None for g in sliding)
            runs.append(runs[-1] + 1 if whole and runs else int(whole))
        for num_hit in range(len(found), 0, -1):
            first = 0 if window is None else first_needed_block(num_hit * bs, window, bs)
            if num_hit - first <= runs[num_hit - 1]:
                entries = [
                    RELEASED_BLOCK if g in sliding and j < first else found[j][g]
                    for j in range(num_hit)
                    for g in range(groups)
                ]
                return entries, first  # type: ignore[return-value]
        return [], 0

    def lookup_prefix(self, block_hashes: Sequence[bytes]) -> list[int]:
        """The indexed blocks of the leading run of logical blocks `block_hashes` whose every
        group's block is indexed here: flat table entries, in table order."""
        found: list[int] = []
        for block_hash in block_hashes:
            ids = [
                self.pool.lookup(group_block_hash(block_hash, g)) for g in range(self.num_groups)
            ]
            if None in ids:
                break
            found.extend(ids)  # type: ignore[arg-type]
        return found

    # ------------------------------------------------------------------- pins

    def pin(self, block_hashes: Sequence[bytes]) -> list[int]:
        """Reference the blocks indexed under the leading run of `block_hashes` (up to the
        first logical block not wholly indexed here), so that they are neither evicted nor
        reused until `unpin`: a peer can copy their KV meanwhile. Returns their ids, as flat
        table entries (every group's block of each logical block), in order."""
        pinned = self.lookup_prefix(block_hashes)
        for block_id in pinned:
            self.pool.touch(block_id)
            self._pinned[block_id] += 1
        return pinned

    def unpin(self, block_ids: Sequence[int]) -> None:
        """Drop pins `pin` took (a block back at refcount 0 is cached again)."""
        for block_id in block_ids:
            if self._pinned[block_id] < 1:
                raise ValueError(f"unpin: block {block_id} is not pinned")
            self._pinned[block_id] -= 1
            if not self._pinned[block_id]:
                del self._pinned[block_id]
            self.pool.release(block_id)

    @property
    def num_pinned_blocks(self) -> int:
        return len(self._pinned)

    # ---------------------------------------------------------------- helpers

    def _allocate(self) -> int:
        block_id = self.pool.allocate()
        assert block_id is not None, "capacity was checked before allocating"
        return block_id

    def _get(self, seq_id: str, what: str) -> SequenceState:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise ValueError(f"{what}: unknown seq_id {seq_id!r}")
        return seq

    def _num_tokens_or_none(self, seq_id: str) -> int | None:
        seq = self._seqs.get(seq_id)
        return None if seq is None else len(seq.token_ids)

    # ------------------------------------------------------------- invariants

    def check_integrity(self) -> None:
        """Raise AssertionError if tables, refcounts, free queue or hash index disagree."""
        self.pool.check_integrity(counters=False)
        references = [0] * self.num_blocks
        for seq_id, seq in self._seqs.items():
            expected = self.layout.table_len(len(seq.token_ids), self.block_size)
            if len(seq.block_table) != expected:
                raise AssertionError(
                    f"seq {seq_id!r}: {len(seq.token_ids)} tokens need {expected} blocks, "
                    f"table has {len(seq.block_table)}"
                )
            self._check_released(seq_id, seq)
            present = seq.present_blocks()
            if len(set(present)) != len(present):
                raise AssertionError(f"seq {seq_id!r}: a block appears twice in its table")
            for block_id in present:
                references[block_id] += 1
            self._check_seq_hashes(seq_id, seq)
        for block_id, count in self._pinned.items():
            references[block_id] += count
        refcounts = self.pool.refcounts()
        if refcounts != references:
            block_id = next(b for b, count in enumerate(references) if refcounts[b] != count)
            raise AssertionError(
                f"block {block_id}: refcount {refcounts[block_id]} but "
                f"{references[block_id]} table and pin references"
            )
        self.pool.check_counters()

    def _check_released(self, seq_id: str, seq: SequenceState) -> None:
        try:
            count = self.layout.num_released(seq.block_table, len(seq.token_ids), self.block_size)
        except ValueError as e:
            raise AssertionError(f"seq {seq_id!r}: {e}") from None
        if count != seq.num_released_blocks:
            raise AssertionError(
                f"seq {seq_id!r}: released slots are not exactly its first "
                f"{seq.num_released_blocks}"
            )

    def _check_seq_hashes(self, seq_id: str, seq: SequenceState) -> None:
        num_full = len(seq.token_ids) // self.block_size
        if seq.num_registered_blocks > num_full:
            raise AssertionError(f"seq {seq_id!r}: more registered blocks than full blocks")
        if len(seq.block_hashes) > num_full:
            raise AssertionError(f"seq {seq_id!r}: more hashes than full blocks")
        for slot, block_id in enumerate(seq.block_table):
            if block_id == RELEASED_BLOCK:
                continue
            index, group = divmod(slot, self.num_groups)
            stored = self.pool.block_hash(block_id)
            expected = (
                group_block_hash(seq.block_hashes[index], group)
                if index < len(seq.block_hashes)
                else None
            )
            if index < seq.num_registered_blocks and stored != expected:
                raise AssertionError(
                    f"seq {seq_id!r}: registered block {block_id} (index {index}) "
                    "does not hold the sequence's chained hash"
                )
            if index >= num_full and stored is not None:
                raise AssertionError(f"seq {seq_id!r}: partial block {block_id} has a hash")
            if stored is not None and expected is not None and stored != expected:
                raise AssertionError(
                    f"seq {seq_id!r}: block {block_id} (index {index}) holds a hash "
                    "that is not the sequence's"
                )


# The in-process implementation of the `BlockAllocator` protocol.
LocalBlockAllocator = BlockManager
