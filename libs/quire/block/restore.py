"""Rebuilding an allocator from an executor's live sequences (after a manager restart).

The executor is the source of truth for its own sequences: it knows every live
sequence's token ids, block table and how many tokens have their KV written. A
memory manager that lost its state (restart, re-registration) rebuilds from that:

- refcount of a block = the number of block tables that reference it (a slot released
  outside a sliding window references none);
- every other block is free, in id order, holding no hash (cached blocks are lost);
- the chained hashes of each sequence's full *computed* blocks are registered in
  the prefix index, in the order of the list (first writer wins).

Everything is validated before any state changes, so a bad list raises ValueError
naming the problem and leaves the manager empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quire.block.hashing import check_token_ids, hash_full_blocks
from quire.block.window import RELEASED_BLOCK, TableLayout


@dataclass(frozen=True)
class LiveSequenceState:
    """One live sequence as its executor knows it (what the allocator last granted)."""

    seq_id: str
    # Every token that holds a KV slot (prompt + outputs appended so far).
    token_ids: tuple[int, ...]
    # Physical block ids in logical order, one per KV group per logical block
    # (quire.block.window.TableLayout). Sliding groups' blocks released outside the window
    # hold RELEASED_BLOCK.
    block_table: tuple[int, ...]
    # Leading tokens whose KV is written in the cache.
    num_computed_tokens: int
    # Mixed into the first block's hash (model id, LoRA id, ...; "" for none).
    extra_key: str = ""


def validate_live_sequences(
    live: Sequence[LiveSequenceState],
    num_blocks: int,
    block_size: int,
    layout: TableLayout | None = None,
) -> list[list[bytes]]:
    """Raise ValueError naming the problem unless `live` describes a consistent pool.

    Returns the chained hashes of every full block of each sequence (same order as
    `live`). Besides per-sequence checks (ids, token ids, table length, block ids in
    range, computed count, released slots only in the sliding groups' leading blocks before
    the window of `layout`), a block referenced by several tables must hold the same content
    in each: same logical index, group and tokens up to its end.
    """
    layout = layout if layout is not None else TableLayout()
    groups = layout.num_groups
    seen: set[str] = set()
    # block id -> (content key, seq id) of its first reference.
    owners: dict[int, tuple[tuple[object, ...], str]] = {}
    all_hashes: list[list[bytes]] = []
    for state in live:
        seq_id = state.seq_id
        if not isinstance(seq_id, str) or not seq_id:
            raise ValueError(f"live_sequences: seq_id {seq_id!r} is not a non-empty str")
        if seq_id in seen:
            raise ValueError(f"live_sequences: seq_id {seq_id!r} listed twice")
        seen.add(seq_id)
        what = f"live_sequences: seq_id {seq_id!r}"
        tokens = list(state.token_ids)
        if not tokens:
            raise ValueError(f"{what} has no token_ids")
        check_token_ids(tokens, what)
        if not isinstance(state.extra_key, str):
            raise ValueError(f"{what}: extra_key is not a str")
        count = state.num_computed_tokens
        if not isinstance(count, int) or not 0 <= count <= len(tokens):
            raise ValueError(f"{what}: num_computed_tokens {count!r} is not in [0, {len(tokens)}]")
        table = list(state.block_table)
        expected = layout.table_len(len(tokens), block_size)
        if len(table) != expected:
            raise ValueError(
                f"{what}: {len(tokens)} tokens need {expected} blocks, block_table has {len(table)}"
            )
        try:
            layout.num_released(table, len(tokens), block_size)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
        present = [(slot, b) for slot, b in enumerate(table) if b != RELEASED_BLOCK]
        for _, block_id in present:
            if not isinstance(block_id, int) or not 0 <= block_id < num_blocks:
                raise ValueError(f"{what}: block id {block_id!r} is not in [0, {num_blocks})")
        if len({b for _, b in present}) != len(present):
            raise ValueError(f"{what}: a block appears twice in its block_table")

        hashes = hash_full_blocks(tokens, block_size, state.extra_key)
        for slot, block_id in present:
            index, group = divmod(slot, groups)
            content = (group, *_content_key(index, hashes, tokens, block_size, state.extra_key))
            owner = owners.setdefault(block_id, (content, seq_id))
            if owner[0] != content:
                raise ValueError(
                    f"{what}: block {block_id} is shared with seq_id {owner[1]!r} "
                    "but holds different tokens (or sits at a different index) there"
                )
        all_hashes.append(hashes)
    return all_hashes


def _content_key(
    index: int, hashes: list[bytes], tokens: list[int], block_size: int, extra_key: str
) -> tuple[object, ...]:
    # A full block is identified by its chained hash (its whole prefix); a partial
    # last block by its parent's hash plus its own tokens.
    if index < len(hashes):
        return (index, hashes[index])
    parent = hashes[index - 1] if index > 0 else extra_key
    return (index, parent, tuple(tokens[index * block_size :]))
