"""Blocks a sequence reads no more: the sliding-window release rule and its table placeholder.

When every layer of a model attends through one sliding window of W tokens
(quire.model.attention_layout), a token at position p reads keys p - W + 1 .. p only. Once
c tokens of a sequence are computed, every token still to come sits at position >= c and
reads nothing before c - W + 1, so the table entries below `first_needed_block(c)` are
never read again: the allocator releases them on the commit of c (their full blocks keep
their hashes, so they stay cached for prefix hits until evicted) and puts `RELEASED_BLOCK`
in their slots. A table keeps its length (ceil(num_tokens / block_size)); the released
slots are always its leading run, since the mark only grows.

A model with any global layer (Gemma 2/3) reads every block of a sequence and releases
nothing: freeing for its sliding layers alone would need a table per layer type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

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
