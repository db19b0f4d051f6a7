"""Blocks a sequence reads no more: the sliding-window release rule and its table placeholder.

When every layer of a model attends through one sliding window of W tokens
(quire.model.attention_layout), a token at position p reads keys p - W + 1 .. p only. Once
c tokens of a sequence are computed, every token still to come sits at position >= c and
reads nothing before c - W + 1, so the table entries below `first_needed_block(c)` are
never read again: the allocator releases them on the commit of c (their full blocks keep
their hashes, so they stay cached for prefix hits until evicted) and puts `RELEASED_BLOCK`
in their slots. A table keeps its length (ceil(num_tokens / block_size)); the released
slots are always its leading run, since the mark only grows.

A model that mixes sliding and global layers (Gemma 2/3, gpt-oss) has its layers split into
KV groups (quire.model.attention_layout.KVGroups), each with a table of its own. The
allocator keeps them as one flat table per sequence, `TableLayout.num_groups` entries per
logical block: entry `j * num_groups + g` is group g's block for logical block j. A commit
releases the sliding groups' entries below the window and keeps the global groups' ones; the
flat table then has released slots in its sliding columns only, the leading `num_released`
logical blocks of each. With one group the flat table is the plain table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from quire.block.sequence_state import cdiv

# The id in a table slot whose block was released: outside every pool (block ids are
# uint32 on the wire, so it travels as itself), never read by a kernel (the model runner
# hands the kernels block 0 there) and skipped by everything that walks a table's blocks.
RELEASED_BLOCK: Final = 0xFFFF_FFFF


def first_needed_block(num_computed_tokens: int, window: int, block_size: int) -> int:
    """The first table index any token after the first `num_computed_tokens` may read:
    the block of position num_computed_tokens - window + 1 (0 while that is negative)."""
    return max(0, (num_computed_tokens - window + 1) // block_size)


def num_released(table: Sequence[int]) -> int:
    """Length of the table's leading run of `RELEASED_BLOCK` slots."""
    count = 0
    for block_id in table:
        if block_id != RELEASED_BLOCK:
            break
        count += 1
    return count


def kernel_table(table: list[int]) -> list[int]:
    """The table as the attention kernels take it: a released slot names block 0, which
    they never read there (every window starts after it)."""
    if not table or table[0] != RELEASED_BLOCK:
        return table
    count = num_released(table)
    return [0] * count + table[count:]


def present_blocks(table: Sequence[int]) -> list[int]:
    """The table's block ids without the released slots."""
    return [block_id for block_id in table if block_id != RELEASED_BLOCK]


@dataclass(frozen=True)
class TableLayout:
    """A sequence's flat block table: one entry per KV group per logical block, and which
    groups slide through the window (their entries below it are released)."""

    windows: tuple[int | None, ...] = (None,)  # per group: its window in tokens; None: global

    def __post_init__(self) -> None:
        if not self.windows:
            raise ValueError("TableLayout: at least one group")
        slides = {w for w in self.windows if w is not None}
        if len(slides) > 1:
            raise ValueError(f"TableLayout: the sliding groups share one window, got {slides}")
        if any(w < 1 for w in slides):
            raise ValueError(f"sliding_window: must be >= 1, got {min(slides)}")

    @classmethod
    def of(cls, sliding_window: int | None = None) -> TableLayout:
        """One group: every layer slides through `sliding_window`, or (None) none does."""
        return cls((sliding_window,))

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def sliding_window(self) -> int | None:
        """The sliding groups' window, None when no group slides."""
        return next((w for w in self.windows if w is not None), None)

    @property
    def sliding_groups(self) -> tuple[int, ...]:
        return tuple(g for g, w in enumerate(self.windows) if w is not None)

    def table_len(self, num_tokens: int, block_size: int) -> int:
        """Entries in the table of a sequence of `num_tokens` tokens."""
        return self.num_groups * cdiv(num_tokens, block_size)

    def released_slots(self, first: int, end: int) -> list[int]:
        """Flat indices of the sliding entries of logical blocks first .. end - 1, latest
        block first."""
        g_count = self.num_groups
        return [j * g_count + g for j in reversed(range(first, end)) for g in self.sliding_groups]

    def group_table(self, table: Sequence[int], group: int) -> list[int]:
        """Group `group`'s own table out of a flat one."""
        return list(table[group :: self.num_groups])

    def num_released(self, table: Sequence[int], num_tokens: int, block_size: int) -> int:
        """The logical blocks whose sliding entries are released, after checking that the
        released slots are exactly those of a leading run of logical blocks, within the
        window of `num_tokens` tokens: ValueError naming the problem otherwise."""
        g_count = self.num_groups
        sliding = self.sliding_groups
        count = 0
        if sliding:
            column = table[sliding[0] :: g_count]
            while count < len(column) and column[count] == RELEASED_BLOCK:
                count += 1
        for index, block_id in enumerate(table):
            released = index % g_count in sliding and index // g_count < count
            if (block_id == RELEASED_BLOCK) != released:
                raise ValueError(f"released slots are not the window's (slot {index})")
        window = self.sliding_window
        if count and (window is None or count > first_needed_block(num_tokens, window, block_size)):
            raise ValueError(f"{count} released blocks, more than its window allows")
        return count
