"""The C++ CPU paged-attention kernels against float64 dense attention and the torch reference.

Batches come from make_paged_batch: shuffled block ids, NaN in every unused cache slot, and
block-table entries past each sequence's blocks pointing at arbitrary (NaN-filled) blocks.
"""

from __future__ import annotations

import math

import pytest
import torch

from quire.kernels import cpp_attention, reference
from tests.kernels.helpers import (
    cu_lens,
    dense_batch_attention,
    make_paged_batch,
    random_queries,
    serial_and_parallel,
)

# The library is built by tests/kernels/conftest.py: if it does not load, these fail.
pytestmark = pytest.mark.usefixtures("cpp_kernels")

# (num_heads, num_kv_heads): MHA, GQA 3 (SmolLM2-135M's 9 / 3), GQA 4.
HEAD_SHAPES = [(4, 4), (9, 3), (8, 2)]
HEAD_SHAPE_IDS = ["mha", "gqa3", "gqa4"]
# Around 16-token block boundaries, and long enough for many blocks.
DECODE_CONTEXT_LENS = [1, 15, 16, 17, 33, 64, 65, 130, 700]
# (cached prefix, chunk): fresh prompts, chunks crossing blocks, single tokens, an empty
# chunk, and chunks spanning several query tiles.
PREFILL_CHUNKS = [
    (0, 1),
    (0, 15),
    (0, 16),
    (0, 17),
    (16, 17),
    (15, 18),
    (40, 1),
    (7, 0),
    (0, 33),
    (5, 70),
    (100, 150),
]
TOLERANCES = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    # The kernel widens 16-bit inputs and works in float32: only the output is rounded.
    torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEAD_SHAPES, ids=HEAD_SHAPE_IDS)
def test_decode_matchesdense_batch_attention(
    num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    batch = make_paged_batch(DECODE_CONTEXT_LENS, num_kv_heads, head_dim, dtype=dtype)
    query = random_queries(len(DECODE_CONTEXT_LENS), num_heads, head_dim, dtype=dtype)
    scale = 1 / math.sqrt(head_dim)

    out = batch.decode(cpp_attention, query, scale)

    assert out.dtype == dtype and out.shape == query.shape
    expected = dense_batch_attention(batch, query, [1] * len(DECODE_CONTEXT_LENS), scale)
    torch.testing.assert_close(out.double(), expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEAD_SHAPES, ids=HEAD_SHAPE_IDS)
def test_prefill_matchesdense_batch_attention(
    num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    context_lens = [prefix + chunk for prefix, chunk in PREFILL_CHUNKS]
    query_lens = [chunk for _, chunk in PREFILL_CHUNKS]
    batch = make_paged_batch(context_lens, num_kv_heads, head_dim, dtype=dtype)
    query = random_queries(sum(query_lens), num_heads, head_dim, dtype=dtype)
    scale = 1 / math.sqrt(head_dim)

    out = batch.prefill(cpp_attention, query, query_lens, scale)

    assert out.dtype == dtype and out.shape == query.shape
    expected = dense_batch_attention(batch, query, query_lens, scale)
    torch.testing.assert_close(out.double(), expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_chunks_match_dense_batch_attention(dtype: torch.dtype) -> None:
    # Contexts long enough that a prefill tile takes fewer tokens than its most (its rows'
    # scores are bounded), odd lengths (bfloat16's key pairs padded), a long cached prefix,
    # and short chunks beside them in the same call.
    chunks = [(0, 701), (301, 400), (0, 2), (1, 3), (999, 2)]
    context_lens = [prefix + chunk for prefix, chunk in chunks]
    query_lens = [chunk for _, chunk in chunks]
    batch = make_paged_batch(context_lens, 3, 64, dtype=dtype)
    query = random_queries(sum(query_lens), 9, 64, dtype=dtype)

    out = batch.prefill(cpp_attention, query, query_lens, 0.125)

    expected = dense_batch_attention(batch, query, query_lens, 0.125)
    torch.testing.assert_close(out.double(), expected, **TOLERANCES[dtype])


# Sizes without a compiled specialization take the generic loops.
@pytest.mark.parametrize(("head_dim", "block_size"), [(80, 16), (64, 8), (128, 32), (32, 1)])
def test_generic_sizes_matchdense_batch_attention(head_dim: int, block_size: int) -> None:
    context_lens = [prefix + chunk for prefix, chunk in PREFILL_CHUNKS]
    query_lens = [chunk for _, chunk in PREFILL_CHUNKS]
    batch = make_paged_batch(context_lens, 2, head_dim, block_size)
    scale = 1 / math.sqrt(head_dim)
    query = random_queries(sum(query_lens), 8, head_dim)
    prefill = batch.prefill(cpp_attention, query, query_lens, scale)
    torch.testing.assert_close(
        prefill.double(),
        dense_batch_attention(batch, query, query_lens, scale),
        **TOLERANCES[torch.float32],
    )

    decode_query = random_queries(len(context_lens), 8, head_dim)
    decode = batch.decode(cpp_attention, decode_query, scale)
    torch.testing.assert_close(
        decode.double(),
        dense_batch_attention(batch, decode_query, [1] * len(context_lens), scale),
        **TOLERANCES[torch.float32],
    )


def test_group_larger_than_a_tile() -> None:
    # 80 query heads on one kv head: a single token's rows exceed kMaxTileRows (64).
    context_lens = [prefix + chunk for prefix, chunk in PREFILL_CHUNKS]
    query_lens = [chunk for _, chunk in PREFILL_CHUNKS]
    batch = make_paged_batch(context_lens, 1, 64)
    query = random_queries(sum(query_lens), 80, 64)
    out = batch.prefill(cpp_attention, query, query_lens, 0.125)
    torch.testing.assert_close(
        out.double(),
        dense_batch_attention(batch, query, query_lens, 0.125),
        **TOLERANCES[torch.float32],
    )


def test_matches_the_torch_reference() -> None:
    context_lens = [prefix + chunk for prefix, chunk in PREFILL_CHUNKS]
    query_lens = [chunk for _, chunk in PREFILL_CHUNKS]
    batch = make_paged_batch(context_lens, 3, 64)
    query = random_queries(sum(query_lens), 9, 64)
    args = (batch.key_cache, batch.value_cache, batch.block_tables)
    cu_query_lens = cu_lens(query_lens)

    out = cpp_attention.paged_prefill_attention(
        query, *args, cu_query_lens, batch.context_lens, 0.125
    )
    expected = reference.paged_prefill_attention(
        query, *args, cu_query_lens, batch.context_lens, 0.125
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_prefill_of_single_tokens_is_decode() -> None:
    batch = make_paged_batch(DECODE_CONTEXT_LENS, 3, 64)
    query = random_queries(len(DECODE_CONTEXT_LENS), 9, 64)

    prefill = batch.prefill(cpp_attention, query, [1] * len(DECODE_CONTEXT_LENS), 0.125)
    decode = batch.decode(cpp_attention, query, 0.125)

    torch.testing.assert_close(prefill, decode, atol=0, rtol=0)


def test_result_does_not_depend_on_the_thread_count() -> None:
    context_lens = [prefix + chunk for prefix, chunk in PREFILL_CHUNKS]
    query_lens = [chunk for _, chunk in PREFILL_CHUNKS]
    batch = make_paged_batch(context_lens, 3, 64)
    query = random_queries(sum(query_lens), 9, 64)
    serial, parallel = serial_and_parallel(
        lambda: batch.prefill(cpp_attention, query, query_lens, 0.125)
    )
    torch.testing.assert_close(parallel, serial, atol=0, rtol=0)


def test_reads_strided_query_and_cache_views() -> None:
    # The query is a view into a fused qkv projection; the caches are [num_blocks, block_size,
    # num_kv_heads, head_dim] views of a [num_blocks, num_kv_heads, block_size, head_dim]
    # allocation, so no stride but head_dim's is the contiguous one.
    chunks = [(3, 5), (7, 0), (20, 13)]
    context_lens = [prefix + chunk for prefix, chunk in chunks]
    query_lens = [chunk for _, chunk in chunks]
    batch = make_paged_batch(context_lens, 2, 64)
    qkv = random_queries(sum(query_lens), 4 + 2 * 2, 64)
    query = qkv[:, :4]
    assert not query.is_contiguous()
    key_cache = batch.key_cache.transpose(1, 2).contiguous().transpose(1, 2)
    value_cache = batch.value_cache.transpose(1, 2).contiguous().transpose(1, 2)
    assert not key_cache.is_contiguous()

    out = cpp_attention.paged_prefill_attention(
        query,
        key_cache,
        value_cache,
        batch.block_tables,
        cu_lens(query_lens),
        batch.context_lens,
        0.2,
    )

    torch.testing.assert_close(
        out.double(),
        dense_batch_attention(batch, query, query_lens, 0.2),
        **TOLERANCES[torch.float32],
    )


def test_empty_batch() -> None:
    batch = make_paged_batch([5], 2, 64)
    query = random_queries(0, 4, 64)
    tables, lens = batch.block_tables[:0], batch.context_lens[:0]
    args = (query, batch.key_cache, batch.value_cache, tables)
    assert cpp_attention.paged_decode_attention(*args, lens, 0.1).shape == (0, 4, 64)
    cu_query_lens = torch.zeros(1, dtype=torch.int32)
    assert cpp_attention.paged_prefill_attention(*args, cu_query_lens, lens, 0.1).shape == (
        0,
        4,
        64,
    )


def _misuse_args() -> dict[str, torch.Tensor]:
    batch = make_paged_batch([5, 20], 2, 64)
    return {
        "key_cache": batch.key_cache,
        "value_cache": batch.value_cache,
        "block_tables": batch.block_tables,
        "context_lens": batch.context_lens,
    }


def _strided_head_dim(cache: torch.Tensor) -> torch.Tensor:
    # Same shape and values, but head_dim is not the contiguous dimension.
    return cache.transpose(2, 3).contiguous().transpose(2, 3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"block_tables": lambda t: t + 100}, "outside"),
        ({"block_tables": lambda t: t - 100}, "outside"),
        ({"context_lens": lambda t: t * 0}, ">= 1"),
        ({"context_lens": lambda t: t * 10}, "capacity"),
        ({"key_cache": _strided_head_dim, "value_cache": _strided_head_dim}, "stride 1"),
    ],
)
def test_decode_misuse_raises_value_error(change: dict, message: str) -> None:
    args = _misuse_args()
    for name, fn in change.items():
        args[name] = fn(args[name])
    with pytest.raises(ValueError, match=message):
        cpp_attention.paged_decode_attention(random_queries(2, 4, 64), scale=0.2, **args)


@pytest.mark.parametrize(
    ("cu_query_lens", "message"),
    [([0, 3], "num_seqs \\+ 1"), ([0, 4, 3], "non-decreasing"), ([1, 2, 3], "from 0")],
)
def test_prefill_misuse_raises_value_error(cu_query_lens: list[int], message: str) -> None:
    cu = torch.tensor(cu_query_lens, dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        cpp_attention.paged_prefill_attention(
            random_queries(3, 4, 64), cu_query_lens=cu, scale=0.2, **_misuse_args()
        )


def test_chunk_longer_than_context_raises() -> None:
    cu = torch.tensor([0, 8, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="chunk lengths"):
        cpp_attention.paged_prefill_attention(
            random_queries(10, 4, 64), cu_query_lens=cu, scale=0.2, **_misuse_args()
        )


# Long contexts: a one-token row's keys are cut into splits of about 256 (whole blocks), each a
# tile of its own, merged after (split decode). Below two splits' worth, one tile.
SPLIT_CONTEXT_LENS = [511, 512, 513, 1000, 2049]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("window", "soft_cap", "with_sinks"),
    [(None, None, False), (300, None, False), (None, 30.0, True), (700, 20.0, True)],
    ids=["plain", "window", "cap-sinks", "window-cap-sinks"],
)
def test_split_decode_matches_the_reference(
    window: int | None, soft_cap: float | None, with_sinks: bool, dtype: torch.dtype
) -> None:
    batch = make_paged_batch(SPLIT_CONTEXT_LENS, 3, 64, dtype=dtype)
    query = random_queries(len(SPLIT_CONTEXT_LENS), 9, 64, dtype=dtype)
    sinks = torch.randn(9, generator=torch.Generator().manual_seed(4)) if with_sinks else None
    args = (query, 0.125, window, soft_cap, sinks)
    out = batch.decode(cpp_attention, *args)
    expected = batch.decode(reference, *args)
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])
    # a one-token prefill chunk is a decode: the same splits, the same bits
    prefill = batch.prefill(cpp_attention, query, [1] * len(SPLIT_CONTEXT_LENS), *args[1:])
    torch.testing.assert_close(prefill, out, atol=0, rtol=0)


def test_a_sequences_decode_does_not_depend_on_its_batch_or_the_threads() -> None:
    # Whether and where a row's keys are split depends on its position only: decoded alone or
    # beside others, on one thread or several, a sequence gets the same bits.
    lens = [40, 600, 1500, 17, 900]
    batch = make_paged_batch(lens, 3, 64)
    query = random_queries(len(lens), 9, 64)
    serial, parallel = serial_and_parallel(lambda: batch.decode(cpp_attention, query, 0.125))
    torch.testing.assert_close(parallel, serial, atol=0, rtol=0)
    for i in range(len(lens)):
        alone = cpp_attention.paged_decode_attention(
            query[i : i + 1],
            batch.key_cache,
            batch.value_cache,
            batch.block_tables[i : i + 1],
            batch.context_lens[i : i + 1],
            0.125,
        )
        torch.testing.assert_close(alone[0], parallel[i], atol=0, rtol=0)
