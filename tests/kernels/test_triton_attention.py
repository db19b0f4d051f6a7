"""Triton paged attention against the torch reference (interpreted on CPU, compiled on CUDA)."""

from __future__ import annotations

import math

import pytest
import torch

from quire.kernels import reference, triton_attention
from tests.kernels.helpers import PagedBatch, make_paged_batch, random_queries

HEAD_SHAPES = [(4, 4), (4, 2), (8, 2), (4, 1)]
HEAD_SHAPE_IDS = ["mha", "gqa2", "gqa4", "mqa"]
# Around 16-token block boundaries, and past the decode kernel's 64-position tiles.
DECODE_CONTEXT_LENS = [1, 15, 16, 17, 32, 33, 65, 130]
# (cached prefix, chunk): chunks crossing blocks, decode-like rows, several query tiles.
PREFILL_CHUNKS = [(0, 1), (0, 17), (16, 17), (15, 18), (40, 1), (0, 33), (5, 70)]
FP32_TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}
# 16-bit inputs: P is rounded to 16 bits before P @ V, as in every flash kernel.
HALF_TOLERANCES = {
    torch.float16: {"atol": 1e-2, "rtol": 1e-2},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}


def _decode_both(
    batch: PagedBatch, query: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return batch.decode(triton_attention, query, scale), batch.decode(reference, query, scale)


def _prefill_both(
    batch: PagedBatch, query: torch.Tensor, query_lens: list[int], scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        batch.prefill(triton_attention, query, query_lens, scale),
        batch.prefill(reference, query, query_lens, scale),
    )


@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEAD_SHAPES, ids=HEAD_SHAPE_IDS)
def test_decode_matches_reference(
    device: str, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    batch = make_paged_batch(DECODE_CONTEXT_LENS, num_kv_heads, head_dim, device=device)
    query = random_queries(len(DECODE_CONTEXT_LENS), num_heads, head_dim, device=device)
    out, expected = _decode_both(batch, query, 1 / math.sqrt(head_dim))
    torch.testing.assert_close(out, expected, **FP32_TOLERANCE)


@pytest.mark.parametrize("block_size", [8, 32])
def test_decode_block_sizes(device: str, block_size: int) -> None:
    batch = make_paged_batch(DECODE_CONTEXT_LENS, 2, 64, block_size, device=device)
    query = random_queries(len(DECODE_CONTEXT_LENS), 4, 64, device=device)
    out, expected = _decode_both(batch, query, 0.125)
    torch.testing.assert_close(out, expected, **FP32_TOLERANCE)


def test_decode_reads_strided_query(device: str) -> None:
    batch = make_paged_batch([3, 17, 40], 2, 32, device=device)
    query = random_queries(3, 8, 32, device=device)[:, :4]
    out, expected = _decode_both(batch, query, 0.2)
    torch.testing.assert_close(out, expected, **FP32_TOLERANCE)


# Every head shape and every head_dim, each once (the interpreter takes seconds a case; decode,
# cheaper, crosses them all).
PREFILL_SHAPES = [(4, 4, 128), (4, 2, 32), (8, 2, 64), (4, 1, 128), (8, 2, 32)]


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"),
    PREFILL_SHAPES,
    ids=[f"{HEAD_SHAPE_IDS[HEAD_SHAPES.index(s[:2])]}-{s[2]}" for s in PREFILL_SHAPES],
)
def test_prefill_matches_reference(
    device: str, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    context_lens = [prefix + chunk for prefix, chunk in PREFILL_CHUNKS]
    query_lens = [chunk for _, chunk in PREFILL_CHUNKS]
    batch = make_paged_batch(context_lens, num_kv_heads, head_dim, device=device)
    query = random_queries(sum(query_lens), num_heads, head_dim, device=device)
    out, expected = _prefill_both(batch, query, query_lens, 1 / math.sqrt(head_dim))
    torch.testing.assert_close(out, expected, **FP32_TOLERANCE)


@pytest.mark.parametrize("block_size", [8, 32])
def test_prefill_block_sizes(device: str, block_size: int) -> None:
    context_lens = [prefix + chunk for prefix, chunk in PREFILL_CHUNKS]
    query_lens = [chunk for _, chunk in PREFILL_CHUNKS]
    batch = make_paged_batch(context_lens, 2, 64, block_size, device=device)
    query = random_queries(sum(query_lens), 4, 64, device=device)
    out, expected = _prefill_both(batch, query, query_lens, 0.125)
    torch.testing.assert_close(out, expected, **FP32_TOLERANCE)


@pytest.mark.parametrize("head_dim", [32, 128])
def test_fp16_matches_reference(device: str, head_dim: int) -> None:
    # 16-bit inputs take the tensor-core tile sizes, which fp32 never uses; numpy has fp16,
    # so the interpreter runs them too.
    context_lens = [prefix + chunk for prefix, chunk in PREFILL_CHUNKS]
    query_lens = [chunk for _, chunk in PREFILL_CHUNKS]
    batch = make_paged_batch(context_lens, 2, head_dim, dtype=torch.float16, device=device)
    scale = 1 / math.sqrt(head_dim)
    query = random_queries(sum(query_lens), 4, head_dim, dtype=torch.float16, device=device)
    out, expected = _prefill_both(batch, query, query_lens, scale)
    torch.testing.assert_close(out, expected, **HALF_TOLERANCES[torch.float16])

    query = random_queries(len(context_lens), 4, head_dim, dtype=torch.float16, device=device)
    out, expected = _decode_both(batch, query, scale)
    torch.testing.assert_close(out, expected, **HALF_TOLERANCES[torch.float16])


def test_prefill_of_single_tokens_is_decode(device: str) -> None:
    batch = make_paged_batch(DECODE_CONTEXT_LENS, 1, 32, device=device)
    query = random_queries(len(DECODE_CONTEXT_LENS), 2, 32, device=device)
    prefill, _ = _prefill_both(batch, query, [1] * len(DECODE_CONTEXT_LENS), 0.2)
    decode, _ = _decode_both(batch, query, 0.2)
    torch.testing.assert_close(prefill, decode, **FP32_TOLERANCE)


def test_prefill_skips_empty_chunks_and_reads_strided_query(device: str) -> None:
    chunks = [(3, 5), (7, 0), (20, 13), (0, 0)]
    context_lens = [prefix + chunk for prefix, chunk in chunks]
    query_lens = [chunk for _, chunk in chunks]
    batch = make_paged_batch(context_lens, 2, 32, device=device)
    query = random_queries(sum(query_lens), 8, 32, device=device)[:, 2:6]
    out, expected = _prefill_both(batch, query, query_lens, 0.2)
    torch.testing.assert_close(out, expected, **FP32_TOLERANCE)


def test_empty_batches(device: str) -> None:
    batch = make_paged_batch([], 1, 32, device=device)
    query = random_queries(0, 2, 32, device=device)
    decode, _ = _decode_both(batch, query, 0.2)
    prefill, _ = _prefill_both(batch, query, [], 0.2)
    assert decode.shape == prefill.shape == (0, 2, 32)


def test_rejects_head_dim_that_is_not_a_power_of_two(device: str) -> None:
    batch = make_paged_batch([4], 1, 48, device=device)
    query = random_queries(1, 1, 48, device=device)
    with pytest.raises(ValueError, match="power of two"):
        _decode_both(batch, query, 0.2)


def test_rejects_query_dtype_unlike_cache(device: str) -> None:
    batch = make_paged_batch([4], 1, 32, device=device)
    query = random_queries(1, 1, 32, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="dtype"):
        triton_attention.paged_decode_attention(
            query, batch.key_cache, batch.value_cache, batch.block_tables, batch.context_lens, 1.0
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_on_gpu(device: str, dtype: torch.dtype) -> None:
    # Realistic head shapes: 32 query heads over 8 kv heads of 128 channels.
    chunks = [(0, 1), (0, 200), (300, 77), (1000, 1), (64, 129), (2049, 1)]
    context_lens = [prefix + chunk for prefix, chunk in chunks]
    query_lens = [chunk for _, chunk in chunks]
    batch = make_paged_batch(context_lens, 8, 128, dtype=dtype, device=device)
    scale = 1 / math.sqrt(128)

    query = random_queries(sum(query_lens), 32, 128, dtype=dtype, device=device)
    out, expected = _prefill_both(batch, query, query_lens, scale)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, **HALF_TOLERANCES[dtype])

    query = random_queries(len(chunks), 32, 128, dtype=dtype, device=device)
    out, expected = _decode_both(batch, query, scale)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, **HALF_TOLERANCES[dtype])
