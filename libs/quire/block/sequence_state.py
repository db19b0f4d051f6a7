"""SequenceState: what the allocator knows about one live sequence."""

from __future__ import annotations

from dataclasses import dataclass, field

# quire.block.window.RELEASED_BLOCK (that module builds on this one).
_RELEASED_BLOCK = 0xFFFF_FFFF


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


@dataclass
class SequenceState:
    """Token ids, block table and hash chain of one live sequence."""

    token_ids: list[int]
    # Mixed into the first block's hash (model id, LoRA id, ...).
    extra_key: str
    # Physical block ids in logical order; len == ceil(len(token_ids) / block_size) times the
    # number of KV groups (quire.block.window.TableLayout: one entry per group per block).
    block_table: list[int] = field(default_factory=list)
    # Chained hashes of the leading full blocks (filled lazily, prefix caching only).
    block_hashes: list[bytes] = field(default_factory=list)
    # Leading blocks already registered in the prefix index.
    num_registered_blocks: int = 0
    # Leading logical blocks whose sliding groups' entries fell out of the window and were
    # released (they hold quire.block.window.RELEASED_BLOCK).
    num_released_blocks: int = 0

    def fork(self) -> SequenceState:
        """A copy sharing the same physical blocks (the caller takes the references)."""
        return SequenceState(
            token_ids=list(self.token_ids),
            extra_key=self.extra_key,
            block_table=list(self.block_table),
            block_hashes=list(self.block_hashes),
            num_registered_blocks=self.num_registered_blocks,
            num_released_blocks=self.num_released_blocks,
        )

    def present_blocks(self) -> list[int]:
        """The blocks the table holds (the released slots left out)."""
        if not self.num_released_blocks:
            return list(self.block_table)
        return [block_id for block_id in self.block_table if block_id != _RELEASED_BLOCK]
