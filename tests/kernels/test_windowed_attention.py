"""Sliding windows and logit soft caps in every paged-attention backend: the torch reference
against textbook dense attention, the C++ and Triton kernels against both. Block table
entries wholly before a chunk's first window point at a block of NaN, as a sequence's freed
blocks may: every backend must leave them unread."""

from __future__ import annotations

import math

import pytest
import torch

from quire.kernels import cpp_attention, reference
from quire.kernels.signatures import PagedAttention
from tests.kernels.helpers import (
    dense_batch_attention,
    drop_blocks_outside_windows,
    make_paged_batch,
    random_queries,
)

# Around 16-token block boundaries, shorter and longer than the windows.
DECODE_CONTEXT_LENS = [1, 5, 16, 17, 33, 64, 130]
# (cached prefix, chunk): fresh prompts longer than the window, chunks after a prefix.
PREFILL_CHUNKS = [(0, 1), (0, 17), (16, 17), (15, 18), (40, 1), (0, 70), (37, 40)]
# A window of 1 (only itself), inside a block, a block, across blocks, longer than them all.
WINDOWS = [1, 5, 16, 33, 1000]
# (num_heads, num_kv_heads): GQA 2 and MQA.
HEAD_SHAPES = [(4, 2), (4, 1)]
TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}


def _backend(name: str) -> PagedAttention:
    if name == "cpp":
        if not cpp_attention.is_available():
            raise AssertionError(f"C++ kernels unavailable: {cpp_attention.unavailable_reason()}")
        return cpp_attention
    if name == "triton":
        from quire.kernels import triton_attention

        return triton_attention
    return reference


def _tolerance(backend: str) -> dict[str, float]:
    return TOLERANCE if backend != "triton" else {"atol": 2e-4, "rtol": 2e-4}


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
@pytest.mark.parametrize("soft_cap", [None, 5.0])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize(("head_dim", "num_heads", "num_kv_heads"), [(64, 4, 2), (128, 4, 1)])
def test_decode_sees_only_its_window(
    backend: str,
    window: int,
    soft_cap: float | None,
    head_dim: int,
    num_heads: int,
    num_kv_heads: int,
) -> None:
    lens = DECODE_CONTEXT_LENS
    batch = make_paged_batch(lens, num_kv_heads, head_dim)
    freed = drop_blocks_outside_windows(batch, [1] * len(lens), window)
    query = random_queries(len(lens), num_heads, head_dim)
    scale = 1 / math.sqrt(head_dim)

    out = freed.decode(_backend(backend), query, scale, window, soft_cap)

    expected = dense_batch_attention(batch, query, [1] * len(lens), scale, window, soft_cap)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), expected, **_tolerance(backend))


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
@pytest.mark.parametrize("soft_cap", [None, 5.0])
@pytest.mark.parametrize("window", WINDOWS)
def test_prefill_sees_only_each_rows_window(
    backend: str, window: int, soft_cap: float | None
) -> None:
    head_dim, num_heads, num_kv_heads = 64, 4, 2
    context_lens = [prefix + chunk for prefix, chunk in PREFILL_CHUNKS]
    query_lens = [chunk for _, chunk in PREFILL_CHUNKS]
    batch = make_paged_batch(context_lens, num_kv_heads, head_dim)
    freed = drop_blocks_outside_windows(batch, query_lens, window)
    query = random_queries(sum(query_lens), num_heads, head_dim)
    scale = 1 / math.sqrt(head_dim)

    out = freed.prefill(_backend(backend), query, query_lens, scale, window, soft_cap)

    expected = dense_batch_attention(batch, query, query_lens, scale, window, soft_cap)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), expected, **_tolerance(backend))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpp_half_precision_window_matches_the_reference(dtype: torch.dtype) -> None:
    lens = [3, 40, 130]
    batch = make_paged_batch(lens, 2, 128, dtype=dtype)
    query = random_queries(len(lens), 8, 128, dtype=dtype)
    args = (query, 0.088, 24, 30.0)
    torch.testing.assert_close(
        batch.decode(_backend("cpp"), *args).float(),
        batch.decode(reference, *args).float(),
        atol=2e-2,
        rtol=2e-2,
    )


def test_a_decode_plan_belongs_to_its_window() -> None:
    batch = make_paged_batch([20, 70], 2, 32)
    query = random_queries(2, 4, 32)
    plan = reference.plan_decode(batch.block_tables, batch.context_lens, 100, 16, 8)
    args = (query, batch.key_cache, batch.value_cache, batch.block_tables, batch.context_lens)
    torch.testing.assert_close(
        reference.paged_decode_attention(*args, 0.2, 8, plan=plan),
        reference.paged_decode_attention(*args, 0.2, 8),
        atol=0,
        rtol=0,
    )
    with pytest.raises(ValueError, match="decode plan"):
        reference.paged_decode_attention(*args, 0.2, 16, plan=plan)


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
@pytest.mark.parametrize(
    ("window", "soft_cap", "message"),
    [(0, None, "sliding_window"), (None, 0.0, "logits_soft_cap"), (None, -1.0, "soft_cap")],
)
def test_bad_window_or_cap_raises(
    backend: str, window: int | None, soft_cap: float | None, message: str
) -> None:
    batch = make_paged_batch([4], 1, 64)
    with pytest.raises(ValueError, match=message):
        batch.decode(_backend(backend), random_queries(1, 1, 64), 0.1, window, soft_cap)
