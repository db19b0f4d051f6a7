"""The appends phase of one step: room for new tokens, copy-on-write, preemption.

Appends are processed in priority order (earliest arrival first). A sequence
whose new tokens need more blocks than are free preempts the sequences at the
END of the appends list, one at a time, until its need fits; if it would have
to preempt itself, it is the one preempted. Preempted sequences are removed
entirely: the scheduler re-admits them later with all their tokens.

Writing into a shared partial last block (after a fork) copies it first; once
only one owner is left, that owner writes in place, so forking a partial block
n ways costs n - 1 copies. With several KV groups (quire.block.window.TableLayout) a
logical block is one entry per group: each group's entry is copied on its own.

Copies run before the forward pass, possibly all at once in one kernel, so no
block may be both a source and a destination in one step. The only way a copy
source could be reallocated within the step is that a preemption drops its
refcount to 0; the copier then takes the source block back and releases its
copy instead (the copy is withdrawn), which also saves the copy.
"""

from __future__ import annotations

from quire.block.allocator import AppendRequest, StepAllocationResult
from quire.block.pool import BlockPool
from quire.block.sequence_state import SequenceState, cdiv

# seq_id -> (table length, the last logical block's entries) before this step touched it;
# None for a table that is new this step (admitted or forked). The step's `TableUpdate`s
# come from it.
Touched = dict[str, tuple[int, tuple[int, ...]] | None]


class AppendPhase:
    """Applies one step's appends to `seqs`, recording into `result`."""

    def __init__(
        self,
        pool: BlockPool,
        seqs: dict[str, SequenceState],
        block_size: int,
        result: StepAllocationResult,
        touched: Touched,
        num_groups: int = 1,
    ) -> None:
        self.pool = pool
        self.num_groups = num_groups
        self.seqs = seqs
        self.block_size = block_size
        self.result = result
        self.touched = touched
        # Copy source block -> (copier seq id, table index, destination block), per copy.
        self._copies_from: dict[int, list[tuple[str, int, int]]] = {}

    def run(self, appends: tuple[AppendRequest, ...]) -> None:
        # Entries after `last_running` have been preempted (always from the end).
        last_running = len(appends) - 1
        for index, append in enumerate(appends):
            if index > last_running:
                break
            seq = self.seqs[append.seq_id]
            num_new = len(append.token_ids)
            while self._blocks_needed(seq, num_new) > self.pool.num_free_blocks:
                # Preempting a fork sibling can also remove the need for a copy,
                # so the need is recomputed after every victim.
                victim = appends[last_running].seq_id
                self._preempt(victim)
                last_running -= 1
                if victim == append.seq_id:
                    break
            if index > last_running:
                break
            self._append(append.seq_id, seq, append.token_ids)

    def _blocks_needed(self, seq: SequenceState, num_new: int) -> int:
        if num_new == 0:
            return 0
        num_tokens = len(seq.token_ids)
        groups = self.num_groups
        num_needed = groups * cdiv(num_tokens + num_new, self.block_size) - len(seq.block_table)
        if num_tokens % self.block_size:
            # copy-on-write of the shared partial last block's entries
            num_needed += sum(self.pool.refcount(b) > 1 for b in seq.block_table[-groups:])
        return num_needed

    def _append(self, seq_id: str, seq: SequenceState, token_ids: tuple[int, ...]) -> None:
        if not token_ids:
            return
        groups = self.num_groups
        table = seq.block_table
        if seq_id not in self.touched:
            self.touched[seq_id] = (len(table), tuple(table[-groups:]))
        if len(seq.token_ids) % self.block_size:
            for index in range(len(table) - groups, len(table)):
                last = table[index]
                if self.pool.refcount(last) > 1:
                    copy = self._allocate()
                    self.result.copies.append((last, copy))
                    self._copies_from.setdefault(last, []).append((seq_id, index, copy))
                    self.pool.release(last)
                    table[index] = copy
                assert self.pool.block_hash(table[index]) is None, (
                    f"writing into registered block {table[index]}"
                )
        seq.token_ids.extend(token_ids)
        for _ in range(groups * cdiv(len(seq.token_ids), self.block_size) - len(table)):
            table.append(self._allocate())

    def _preempt(self, seq_id: str) -> None:
        seq = self.seqs.pop(seq_id)
        for block_id in self.pool.release_tail_first(seq.present_blocks()):
            if self._copies_from.get(block_id):
                self._withdraw_copy(block_id)
        self.result.preempted.append(seq_id)

    def _withdraw_copy(self, src: int) -> None:
        # The last other owner of `src` is gone: its latest copier writes in place.
        copier_id, index, dst = self._copies_from[src].pop()
        copier = self.seqs[copier_id]
        assert copier.block_table[index] == dst, f"copy {src}->{dst} of {copier_id!r} moved"
        self.pool.touch(src)
        copier.block_table[index] = src
        self.pool.release(dst)
        self.result.copies.remove((src, dst))

    def _allocate(self) -> int:
        block_id = self.pool.allocate()
        assert block_id is not None, "capacity was checked before allocating"
        return block_id
