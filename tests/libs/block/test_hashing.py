"""Chained block hashes: the cross-service wire contract for prefix-cache keys."""

from __future__ import annotations

import hashlib
import struct

import pytest

from quire.block.hashing import HASH_SIZE, extend_block_hashes, hash_block, hash_full_blocks

# Computed once from the documented encoding. If one of these changes, every
# router, memory manager and Redis entry in a fleet disagrees: do not update
# them to make a test pass, version the encoding instead.
GOLDEN_FIRST = "366c1b2449076e17e896d74ee28dd7e7"  # hash_block(None, range(16))
GOLDEN_EXTRA = "e82ec685c9d6adaeb89d3593915a0c78"  # hash_block(None, range(16), "llama")
GOLDEN_SECOND = "217998e0c504025c009192a1d3b4eaf0"  # range(16, 32) chained to GOLDEN_FIRST


def test_golden_digests() -> None:
    first = hash_block(None, list(range(16)))
    assert first.hex() == GOLDEN_FIRST
    assert hash_block(None, tuple(range(16)), "llama").hex() == GOLDEN_EXTRA
    assert hash_block(first, range(16, 32)).hex() == GOLDEN_SECOND
    assert [h.hex() for h in hash_full_blocks(list(range(40)), 16)] == [
        GOLDEN_FIRST,
        GOLDEN_SECOND,
    ]


def test_encoding_matches_documentation() -> None:
    tokens = [7, 0, 2**32 - 1, 123456]
    key = "lora-ü".encode()
    expected = hashlib.blake2b(
        bytes(16) + struct.pack("<I", len(key)) + key + struct.pack("<4I", *tokens),
        digest_size=16,
    ).digest()
    assert hash_block(None, tokens, "lora-ü") == expected
    parent = bytes(range(16))
    expected_child = hashlib.blake2b(
        parent + struct.pack("<I", 0) + struct.pack("<4I", *tokens), digest_size=16
    ).digest()
    assert hash_block(parent, tokens) == expected_child
    assert len(expected) == HASH_SIZE


def test_chaining_changes_every_later_hash() -> None:
    tokens = list(range(100, 164))  # 4 blocks of 16
    changed = list(tokens)
    changed[3] = 9999
    base = hash_full_blocks(tokens, 16)
    other = hash_full_blocks(changed, 16)
    assert len(base) == len(other) == 4
    assert all(a != b for a, b in zip(base, other, strict=True))
    # A change in block 2 leaves blocks 0 and 1 alone.
    late = list(tokens)
    late[40] = 9999
    late_hashes = hash_full_blocks(late, 16)
    assert late_hashes[:2] == base[:2]
    assert late_hashes[2] != base[2] and late_hashes[3] != base[3]


def test_same_block_different_parent_differs() -> None:
    block = list(range(16))
    assert hash_block(None, block) != hash_block(hash_block(None, block), block)


def test_extra_key_changes_all_hashes() -> None:
    tokens = list(range(48))
    plain = hash_full_blocks(tokens, 16)
    keyed = hash_full_blocks(tokens, 16, extra_key="model-a")
    other = hash_full_blocks(tokens, 16, extra_key="model-b")
    assert all(len({a, b, c}) == 3 for a, b, c in zip(plain, keyed, other, strict=True))
    # The key is length-prefixed, so it cannot be confused with token bytes.
    assert hash_block(None, [1], "a") != hash_block(None, [1], "a\x00")


def test_partial_blocks_not_hashed() -> None:
    assert hash_full_blocks(list(range(15)), 16) == []
    assert len(hash_full_blocks(list(range(16)), 16)) == 1
    assert len(hash_full_blocks(list(range(47)), 16)) == 2
    assert hash_full_blocks(list(range(47)), 16) == hash_full_blocks(list(range(32)), 16)
    assert hash_full_blocks([], 4) == []


def test_extend_is_incremental() -> None:
    tokens = list(range(50))
    hashes: list[bytes] = []
    extend_block_hashes(hashes, tokens[:10], 4, "k")
    assert len(hashes) == 2
    extend_block_hashes(hashes, tokens, 4, "k")
    assert hashes == hash_full_blocks(tokens, 4, "k")


def test_stable_across_processes() -> None:
    import subprocess
    import sys

    code = (
        "from quire.block.hashing import hash_full_blocks;"
        "print(hash_full_blocks(list(range(40)), 16)[1].hex())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
    )
    assert out.stdout.strip() == GOLDEN_SECOND


@pytest.mark.parametrize("bad", [[-1], [2**32], [1.5], ["a"]])
def test_bad_token_ids_raise(bad: list[object]) -> None:
    with pytest.raises(ValueError, match="token id"):
        hash_block(None, bad)  # type: ignore[arg-type]


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="parent_hash"):
        hash_block(b"short", [1])
    with pytest.raises(ValueError, match="token_ids"):
        hash_block(None, [])
    with pytest.raises(ValueError, match="block_size"):
        hash_full_blocks([1, 2], 0)
