"""Chained block hashes: the prefix-cache key shared by router, memory manager and Redis.

A full block's hash covers its own token ids and, through the parent hash, every
token before it, so equal hashes mean equal prefixes. The encoding is fixed and
platform independent (blake2b over little-endian uint32 token ids), never
Python's salted `hash()`: every service must produce the same bytes.

Encoding of one block, fed to blake2b(digest_size=16):

    parent hash (16 bytes; 16 zero bytes for the first block)
    len(extra_key as UTF-8) as little-endian uint32, then those bytes
    token ids as little-endian uint32, in order

The extra key (model id, LoRA id, ...) is mixed into the first block only; the
chain carries it into every later hash.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

# Bytes in one block hash (blake2b digest size).
HASH_SIZE = 16
# Token ids are encoded as uint32.
MAX_TOKEN_ID = 2**32 - 1

_ROOT_PARENT = bytes(HASH_SIZE)
_LENGTH = struct.Struct("<I")


def check_token_ids(token_ids: Sequence[int], what: str = "token_ids") -> None:
    """Raise ValueError unless every id is an int in [0, 2**32)."""
    for token_id in token_ids:
        if not isinstance(token_id, int) or not 0 <= token_id <= MAX_TOKEN_ID:
            raise ValueError(f"{what}: token id {token_id!r} is not an int in [0, 2**32)")


def hash_block(parent_hash: bytes | None, token_ids: Sequence[int], extra_key: str = "") -> bytes:
    """Hash one block of token ids chained to its parent block's hash.

    `parent_hash` is None for the first block of a sequence. Returns 16 bytes.
    """
    if parent_hash is None:
        parent_hash = _ROOT_PARENT
    elif len(parent_hash) != HASH_SIZE:
        raise ValueError(f"parent_hash: expected {HASH_SIZE} bytes, got {len(parent_hash)}")
    if not token_ids:
        raise ValueError("token_ids: a block needs at least one token")
    check_token_ids(token_ids)
    key = extra_key.encode("utf-8")
    hasher = hashlib.blake2b(digest_size=HASH_SIZE)
    hasher.update(parent_hash)
    hasher.update(_LENGTH.pack(len(key)))
    hasher.update(key)
    hasher.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    return hasher.digest()


def extend_block_hashes(
    block_hashes: list[bytes],
    token_ids: Sequence[int],
    block_size: int,
    extra_key: str = "",
) -> list[bytes]:
    """Append to `block_hashes` the chained hashes of the full blocks it lacks.

    `block_hashes` must hold the hashes of the leading full blocks of `token_ids`
    (possibly none); the list is extended in place and returned. This is the
    incremental form of `hash_full_blocks` for sequences that keep growing.
    """
    if block_size < 1:
        raise ValueError(f"block_size: must be >= 1, got {block_size}")
    num_full_blocks = len(token_ids) // block_size
    if len(block_hashes) > num_full_blocks:
        raise ValueError(
            f"block_hashes: {len(block_hashes)} hashes for only {num_full_blocks} full blocks"
        )
    for index in range(len(block_hashes), num_full_blocks):
        parent = block_hashes[index - 1] if index > 0 else None
        block = token_ids[index * block_size : (index + 1) * block_size]
        block_hashes.append(hash_block(parent, block, extra_key if index == 0 else ""))
    return block_hashes


def group_block_hash(block_hash: bytes, group: int) -> bytes:
    """The prefix-index key of KV group `group`'s block for the logical block hashed
    `block_hash` (quire.block.window.TableLayout): the hash itself for group 0, so routers
    that know nothing of groups look up the same keys; blake2b over it and the group's
    index (little-endian uint32) for the others."""
    if group == 0:
        return block_hash
    hasher = hashlib.blake2b(digest_size=HASH_SIZE)
    hasher.update(block_hash)
    hasher.update(_LENGTH.pack(group))
    return hasher.digest()


def hash_full_blocks(token_ids: Sequence[int], block_size: int, extra_key: str = "") -> list[bytes]:
    """Chained hashes of every full block of `token_ids` (a partial tail is not hashed)."""
    return extend_block_hashes([], token_ids, block_size, extra_key)
