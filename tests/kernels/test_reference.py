"""The torch reference against textbook dense attention: what makes it a trustworthy oracle."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from quire.kernels import reference
from tests.kernels.helpers import (
    cu_lens,
    dense_batch_attention,
    dense_causal_attention,
    make_paged_batch,
    random_queries,
)

# (num_heads, num_kv_heads): MHA, GQA 2, GQA 4, MQA.
HEAD_SHAPES = [(4, 4), (4, 2), (8, 2), (4, 1)]
HEAD_SHAPE_IDS = ["mha", "gqa2", "gqa4", "mqa"]
# Around block boundaries for block sizes 8, 16 and 32, and past two 64-token tiles.
DECODE_CONTEXT_LENS = [1, 15, 16, 17, 32, 33, 63, 64, 65, 130]
# (cached prefix, chunk): fresh prompts, chunks crossing blocks, decode-like single tokens.
PREFILL_CHUNKS = [(0, 1), (0, 15), (0, 16), (0, 17), (16, 17), (15, 18), (40, 1), (0, 33), (5, 70)]
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEAD_SHAPES, ids=HEAD_SHAPE_IDS)
def test_decode_matches_dense(
    device: str, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    batch = make_paged_batch(DECODE_CONTEXT_LENS, num_kv_heads, head_dim, block_size, device=device)
    query = random_queries(len(DECODE_CONTEXT_LENS), num_heads, head_dim, device=device)
    scale = 1 / math.sqrt(head_dim)

    out = batch.decode(reference, query, scale)

    expected = dense_batch_attention(batch, query, [1] * len(DECODE_CONTEXT_LENS), scale)
    assert out.dtype == query.dtype
    torch.testing.assert_close(out.double(), expected, **TOLERANCE)


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEAD_SHAPES, ids=HEAD_SHAPE_IDS)
def test_prefill_matches_dense(
    device: str, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    context_lens = [prefix + chunk for prefix, chunk in PREFILL_CHUNKS]
    query_lens = [chunk for _, chunk in PREFILL_CHUNKS]
    batch = make_paged_batch(context_lens, num_kv_heads, head_dim, block_size, device=device)
    query = random_queries(sum(query_lens), num_heads, head_dim, device=device)
    scale = 1 / math.sqrt(head_dim)

    out = batch.prefill(reference, query, query_lens, scale)

    torch.testing.assert_close(
        out.double(), dense_batch_attention(batch, query, query_lens, scale), **TOLERANCE
    )


def test_prefill_of_single_tokens_is_decode(device: str) -> None:
    batch = make_paged_batch(DECODE_CONTEXT_LENS, 2, 64, device=device)
    query = random_queries(len(DECODE_CONTEXT_LENS), 8, 64, device=device)

    prefill = batch.prefill(reference, query, [1] * len(DECODE_CONTEXT_LENS), 0.125)
    decode = batch.decode(reference, query, 0.125)

    torch.testing.assert_close(prefill, decode, **TOLERANCE)


def test_prefill_skips_empty_chunks_and_reads_strided_query(device: str) -> None:
    # A sequence with nothing scheduled this step (chunk 0) sits between two real ones, and
    # the query is a view into a fused qkv projection, as a model produces it.
    chunks = [(3, 5), (7, 0), (20, 13)]
    context_lens = [prefix + chunk for prefix, chunk in chunks]
    query_lens = [chunk for _, chunk in chunks]
    batch = make_paged_batch(context_lens, 2, 32, device=device)
    qkv = random_queries(sum(query_lens), 4 + 2 * 2, 32, device=device)
    query = qkv[:, :4]
    assert not query.is_contiguous()

    out = batch.prefill(reference, query, query_lens, 0.2)

    torch.testing.assert_close(
        out.double(), dense_batch_attention(batch, query, query_lens, 0.2), **TOLERANCE
    )


def test_written_chunk_is_read_back_by_prefill(device: str) -> None:
    # The engine's order: write the chunk's keys/values at their slots, then attend.
    prefix_len, chunk_len, block_size = 13, 9, 8
    batch = make_paged_batch([prefix_len + chunk_len], 1, 32, block_size, device=device)
    dense_keys, dense_values = batch.keys[0], batch.values[0]
    key_cache = batch.key_cache.clone()
    value_cache = batch.value_cache.clone()
    positions = torch.arange(prefix_len, prefix_len + chunk_len, device=device)
    block_ids = batch.block_tables[0].long()[positions // block_size]
    slot_mapping = block_ids * block_size + positions % block_size
    key_cache[block_ids, positions % block_size] = float("nan")
    value_cache[block_ids, positions % block_size] = float("nan")

    reference.write_kv_cache(
        dense_keys[prefix_len:], dense_values[prefix_len:], key_cache, value_cache, slot_mapping
    )
    query = random_queries(chunk_len, 2, 32, device=device)
    out = reference.paged_prefill_attention(
        query,
        key_cache,
        value_cache,
        batch.block_tables,
        cu_lens([chunk_len], device),
        batch.context_lens,
        0.3,
    )

    expected = dense_causal_attention(query, dense_keys, dense_values, 0.3)
    torch.testing.assert_close(out.double(), expected, **TOLERANCE)


def test_write_kv_cache_fills_exactly_the_mapped_slots(device: str) -> None:
    num_blocks, block_size, num_kv_heads, head_dim = 5, 8, 2, 32
    key_cache = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, device=device)
    value_cache = torch.zeros_like(key_cache)
    slot_mapping = torch.tensor([17, 0, 39, 8, 9], device=device)
    key = random_queries(5, num_kv_heads, head_dim, device=device, seed=3)
    value = random_queries(5, num_kv_heads, head_dim, device=device, seed=4)

    reference.write_kv_cache(key, value, key_cache, value_cache, slot_mapping)

    expected_keys = torch.zeros_like(key_cache)
    expected_values = torch.zeros_like(value_cache)
    for token, slot in enumerate(slot_mapping.tolist()):
        expected_keys[slot // block_size, slot % block_size] = key[token]
        expected_values[slot // block_size, slot % block_size] = value[token]
    assert torch.equal(key_cache, expected_keys)
    assert torch.equal(value_cache, expected_values)


def test_copy_blocks_copies_every_layer(device: str) -> None:
    num_layers, shape = 3, (6, 8, 2, 32)
    key_caches = [torch.randn(shape, device=device) for _ in range(num_layers)]
    value_caches = [torch.randn(shape, device=device) for _ in range(num_layers)]
    expected = [cache.clone() for cache in (*key_caches, *value_caches)]
    for cache in expected:
        cache[4] = cache[1]
        cache[0] = cache[1]
        cache[5] = cache[2]
    block_mapping = torch.tensor([[1, 4], [1, 0], [2, 5]], device=device)

    reference.copy_blocks(key_caches, value_caches, block_mapping)

    for cache, want in zip((*key_caches, *value_caches), expected, strict=True):
        assert torch.equal(cache, want)


def _decode_args(device: str) -> dict[str, object]:
    batch = make_paged_batch([5, 20], 2, 32, 16, device=device)
    return {
        "query": random_queries(2, 4, 32, device=device),
        "key_cache": batch.key_cache,
        "value_cache": batch.value_cache,
        "block_tables": batch.block_tables,
        "context_lens": batch.context_lens,
        "scale": 0.2,
    }


DECODE_MISUSES: dict[str, Callable[[dict], None]] = {
    "int64 block tables": lambda a: a.update(block_tables=a["block_tables"].long()),
    "heads not a multiple": lambda a: a.update(query=a["query"][:, :3]),
    "head_dim mismatch": lambda a: a.update(query=a["query"][..., :16]),
    "dtype mismatch": lambda a: a.update(query=a["query"].double()),
    "two queries per seq": lambda a: a.update(query=a["query"].repeat(2, 1, 1)),
    "empty context": lambda a: a.update(context_lens=a["context_lens"] * 0),
    "context past table": lambda a: a.update(context_lens=a["context_lens"] * 10),
    "block id out of range": lambda a: a.update(block_tables=a["block_tables"] + 100),
    "3-d cache": lambda a: a.update(key_cache=a["key_cache"][0]),
}


@pytest.mark.parametrize("misuse", DECODE_MISUSES.values(), ids=DECODE_MISUSES.keys())
def test_decode_misuse_raises_value_error(device: str, misuse: Callable[[dict], None]) -> None:
    args = _decode_args(device)
    misuse(args)
    with pytest.raises(ValueError):
        reference.paged_decode_attention(**args)


@pytest.mark.parametrize(
    ("cu_query_lens", "message"),
    [([0, 3], "num_seqs \\+ 1"), ([0, 4, 3], "non-decreasing"), ([1, 2, 3], "from 0")],
)
def test_prefill_misuse_raises_value_error(
    device: str, cu_query_lens: list[int], message: str
) -> None:
    args = _decode_args(device)
    args.pop("query")
    query = random_queries(3, 4, 32, device=device)
    cu = torch.tensor(cu_query_lens, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=message):
        reference.paged_prefill_attention(query, cu_query_lens=cu, **args)


def test_chunk_longer_than_context_raises(device: str) -> None:
    args = _decode_args(device)
    args.pop("query")
    query = random_queries(10, 4, 32, device=device)
    cu = torch.tensor([0, 8, 10], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="chunk lengths"):
        reference.paged_prefill_attention(query, cu_query_lens=cu, **args)


def test_write_kv_cache_rejects_slots_out_of_range(device: str) -> None:
    key_cache = torch.zeros(2, 8, 1, 32, device=device)
    key = torch.ones(1, 1, 32, device=device)
    slot_mapping = torch.tensor([16], device=device)
    with pytest.raises(ValueError, match="outside"):
        reference.write_kv_cache(key, key, key_cache, key_cache.clone(), slot_mapping)


@pytest.mark.parametrize(
    ("pairs", "message"),
    [([[0, 1], [2, 1]], "distinct"), ([[0, 1], [1, 2]], "also a source"), ([[0, 9]], "outside")],
)
def test_copy_blocks_rejects_overlapping_pairs(
    device: str, pairs: list[list[int]], message: str
) -> None:
    caches = [torch.zeros(4, 8, 1, 32, device=device)]
    block_mapping = torch.tensor(pairs, device=device)
    with pytest.raises(ValueError, match=message):
        reference.copy_blocks(caches, [caches[0].clone()], block_mapping)


def test_decode_groups_sequences_of_similar_length() -> None:
    lens = torch.tensor([130, 1, 17, 120, 15, 64, 16, 65, 33, 2000], dtype=torch.int32)
    groups = reference._length_groups(-(-lens.long() // 16))
    rows = torch.cat(groups).tolist()
    assert sorted(rows) == list(range(len(lens)))  # every sequence exactly once
    assert 1 < len(groups) <= reference._MAX_GROUPS
    blocks = [(-(-lens[g].long() // 16)).tolist() for g in groups]
    assert blocks[0] == [125]  # the outlier does not pad everyone else to 2000 tokens
    assert [max(b) for b in blocks] == sorted((max(b) for b in blocks), reverse=True)
    for b in blocks[:-1]:  # all but the catch-all last group keep padding in bounds
        assert max(b) * len(b) <= reference._MAX_PADDING_RATIO * sum(b)
    same = torch.tensor([40, 33, 48, 35], dtype=torch.int32)
    assert len(reference._length_groups(-(-same.long() // 16))) == 1


def test_a_decode_plan_is_reused_and_bound_to_its_inputs() -> None:
    lens = [1, 15, 17, 130, 600]
    batch = make_paged_batch(lens, 2, 32, 16)
    query = random_queries(len(lens), 4, 32)
    args = (batch.key_cache, batch.value_cache, batch.block_tables, batch.context_lens, 0.25)
    plan = reference.plan_decode(
        batch.block_tables, batch.context_lens, batch.key_cache.shape[0], 16
    )
    assert len(plan.groups) > 1  # 600 tokens next to 1 are not padded together
    torch.testing.assert_close(
        reference.paged_decode_attention(query, *args, plan=plan),
        reference.paged_decode_attention(query, *args),
        atol=0,
        rtol=0,
    )
    other_lens = batch.context_lens.clone()
    with pytest.raises(ValueError, match="decode plan"):
        reference.paged_decode_attention(
            query,
            batch.key_cache,
            batch.value_cache,
            batch.block_tables,
            other_lens,
            0.25,
            plan=plan,
        )
    with pytest.raises(ValueError, match="capacity"):
        reference.plan_decode(batch.block_tables, batch.context_lens * 100, 10_000, 16)
